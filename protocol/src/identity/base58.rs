//! Base58 with the Bitcoin alphabet ("base58btc"), the text form of libp2p peer ids.
//!
//! Quadratic schoolbook conversion over caller-provided buffers: peer ids are 38 bytes, so
//! this is small, allocation-free and needs no dependency.

/// The base58btc alphabet: digits and letters without `0`, `O`, `I` and `l`.
const ALPHABET: &[u8; 58] = b"123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz";

/// The digit value of each ASCII character, or `INVALID`.
const DIGIT_OF: [u8; 128] = {
    let mut table = [INVALID; 128];
    let mut digit = 0;
    while digit < ALPHABET.len() {
        table[ALPHABET[digit] as usize] = digit as u8;
        digit += 1;
    }
    table
};
const INVALID: u8 = 0xff;

/// The output buffer was too small for the conversion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Overflow;

/// Why a base58 string could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DecodeError {
    /// A character outside the base58btc alphabet, at this character index.
    InvalidChar { ch: char, position: usize },
    /// The decoded bytes do not fit the output buffer.
    Overflow,
}

/// Writes the base58btc text of `input` into `out` (ASCII bytes) and returns its length.
pub(super) fn encode(input: &[u8], out: &mut [u8]) -> Result<usize, Overflow> {
    // Each leading zero byte becomes one leading '1'.
    let zeros = input.iter().take_while(|&&b| b == 0).count();
    // Base58 digits of the rest, least significant first, built in `out` after the ones.
    let (ones, digits) = out.split_at_mut_checked(zeros).ok_or(Overflow)?;
    ones.fill(ALPHABET[0]);
    let mut len = 0;
    for &byte in &input[zeros..] {
        let mut carry = u32::from(byte);
        for digit in &mut digits[..len] {
            carry += u32::from(*digit) << 8;
            *digit = (carry % 58) as u8;
            carry /= 58;
        }
        while carry > 0 {
            let slot = digits.get_mut(len).ok_or(Overflow)?;
            *slot = (carry % 58) as u8;
            len += 1;
            carry /= 58;
        }
    }
    let digits = &mut digits[..len];
    digits.reverse();
    for digit in digits.iter_mut() {
        *digit = ALPHABET[usize::from(*digit)];
    }
    Ok(zeros + len)
}

/// Decodes base58btc `text` into `out` and returns the number of bytes written.
pub(super) fn decode(text: &str, out: &mut [u8]) -> Result<usize, DecodeError> {
    let zeros = text.bytes().take_while(|&c| c == ALPHABET[0]).count();
    let (zero_bytes, bytes) = out
        .split_at_mut_checked(zeros)
        .ok_or(DecodeError::Overflow)?;
    zero_bytes.fill(0);
    // Bytes of the rest, least significant first.
    let mut len = 0;
    for (position, ch) in text.chars().enumerate().skip(zeros) {
        let digit = DIGIT_OF
            .get(u32::from(ch) as usize)
            .copied()
            .filter(|&d| d != INVALID)
            .ok_or(DecodeError::InvalidChar { ch, position })?;
        let mut carry = u32::from(digit);
        for byte in &mut bytes[..len] {
            carry += u32::from(*byte) * 58;
            *byte = (carry & 0xff) as u8;
            carry >>= 8;
        }
        while carry > 0 {
            let slot = bytes.get_mut(len).ok_or(DecodeError::Overflow)?;
            *slot = (carry & 0xff) as u8;
            len += 1;
            carry >>= 8;
        }
    }
    bytes[..len].reverse();
    Ok(zeros + len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(bytes: &[u8], text: &str) {
        let mut encoded = [0u8; 128];
        let n = encode(bytes, &mut encoded).expect("test buffer is large enough");
        assert_eq!(&encoded[..n], text.as_bytes());
        let mut decoded = [0u8; 128];
        let n = decode(text, &mut decoded).expect("valid base58");
        assert_eq!(&decoded[..n], bytes);
    }

    #[test]
    fn known_vectors() {
        round_trip(b"", "");
        round_trip(&[0], "1");
        round_trip(&[0, 0, 1], "112");
        round_trip(&[57], "z");
        round_trip(&[58], "21");
        round_trip(b"Hello World!", "2NEpo7TZRRrLZSi2U");
        round_trip(
            b"The quick brown fox jumps over the lazy dog.",
            "USm3fpXnKG5EUBx2ndxBDMPVciP5hGey2Jh4NDv6gmeo1LkMeiKrLJUUBk6Z",
        );
    }

    #[test]
    fn rejects_characters_outside_the_alphabet() {
        let mut out = [0u8; 16];
        for (text, ch, position) in [
            ("1O", 'O', 1),
            ("0", '0', 0),
            ("abl", 'l', 2),
            ("2é", 'é', 1),
        ] {
            assert_eq!(
                decode(text, &mut out),
                Err(DecodeError::InvalidChar { ch, position })
            );
        }
    }

    #[test]
    fn reports_overflow_instead_of_panicking() {
        let mut small = [0u8; 2];
        assert_eq!(encode(&[0xff, 0xff, 0xff], &mut small), Err(Overflow));
        assert_eq!(encode(&[0, 0, 0], &mut small), Err(Overflow));
        assert_eq!(decode("zzzzzz", &mut small), Err(DecodeError::Overflow));
        assert_eq!(decode("111", &mut small), Err(DecodeError::Overflow));
    }
}
