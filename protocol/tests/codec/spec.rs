use murmur_protocol::codec::{CodecError, CodecSpec};
use proptest::prelude::*;

use crate::any_spec;

proptest! {
    #[test]
    fn wire_form_roundtrips(spec in any_spec()) {
        prop_assert_eq!(CodecSpec::from_wire(spec.to_wire()), Ok(spec));
        prop_assert_eq!(CodecSpec::parse(&spec.to_string()), Ok(spec));
    }

    #[test]
    fn from_wire_never_panics(bytes in any::<[u8; 5]>()) {
        let _ = CodecSpec::from_wire(bytes);
    }
}

#[test]
fn invalid_specs_are_named() {
    for text in [
        "int8:16",
        "int8:8192",
        "int8:100",
        "topk:0",
        "topk:2000000",
        "f16:4",
        "int9",
        "int8:x",
    ] {
        let err = CodecSpec::parse(text).unwrap_err();
        assert!(
            matches!(err, CodecError::InvalidSpec { .. }),
            "{text}: {err}"
        );
    }
    assert_eq!(
        CodecSpec::from_wire([99, 0, 0, 0, 0]),
        Err(CodecError::UnknownCodec { id: 99 })
    );
    assert_eq!(CodecSpec::parse("int8"), Ok(CodecSpec::Int8 { block: 64 }));
}
