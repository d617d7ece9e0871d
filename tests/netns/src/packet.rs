//! The IPv4 header fields the delay stage reads, and IPv4 subnets.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// Length of an IPv4 header without options: the least a packet must hold to be classified.
const IPV4_MIN_HEADER_LEN: usize = 20;

/// The source and destination addresses of an IPv4 packet.
///
/// Returns `None` when `packet` is not IPv4 or is shorter than an IPv4 header; the delay stage
/// forwards such packets without delay or loss.
pub fn ipv4_endpoints(packet: &[u8]) -> Option<(Ipv4Addr, Ipv4Addr)> {
    let header = packet.get(..IPV4_MIN_HEADER_LEN)?;
    if header[0] >> 4 != 4 {
        return None;
    }
    let source = Ipv4Addr::new(header[12], header[13], header[14], header[15]);
    let destination = Ipv4Addr::new(header[16], header[17], header[18], header[19]);
    Some((source, destination))
}

/// An IPv4 subnet such as `10.77.1.0/24`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Subnet {
    network: Ipv4Addr,
    prefix_len: u8,
}

/// Why a subnet could not be built or parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubnetError {
    /// The text has no `/` between the address and the prefix length.
    #[error("subnet `{text}` has no prefix length; write it as ADDRESS/LENGTH, e.g. 10.77.1.0/24")]
    MissingPrefix {
        /// The text as given.
        text: String,
    },
    /// The address part is not an IPv4 address.
    #[error("subnet `{text}` does not start with an IPv4 address")]
    BadAddress {
        /// The text as given.
        text: String,
    },
    /// The prefix length is not a number from 0 to 32.
    #[error("subnet `{text}` has a prefix length outside 0..=32")]
    BadPrefix {
        /// The text as given.
        text: String,
    },
}

impl Ipv4Subnet {
    /// The subnet of `address` with `prefix_len` leading bits; host bits are cleared.
    pub fn new(address: Ipv4Addr, prefix_len: u8) -> Result<Self, SubnetError> {
        if prefix_len > 32 {
            return Err(SubnetError::BadPrefix {
                text: format!("{address}/{prefix_len}"),
            });
        }
        let network = Ipv4Addr::from(u32::from(address) & mask(prefix_len));
        Ok(Self {
            network,
            prefix_len,
        })
    }

    /// The network address (host bits zero).
    pub fn network(&self) -> Ipv4Addr {
        self.network
    }

    /// The number of leading bits that name the network.
    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    /// Whether `address` lies inside this subnet.
    pub fn contains(&self, address: Ipv4Addr) -> bool {
        u32::from(address) & mask(self.prefix_len) == u32::from(self.network)
    }
}

/// The netmask of a prefix length from 0 to 32.
fn mask(prefix_len: u8) -> u32 {
    // `checked_shl` covers /0, where a 32-bit shift would overflow.
    u32::MAX
        .checked_shl(32 - u32::from(prefix_len))
        .unwrap_or(0)
}

impl fmt::Display for Ipv4Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix_len)
    }
}

impl FromStr for Ipv4Subnet {
    type Err = SubnetError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (address, prefix) = text.split_once('/').ok_or(SubnetError::MissingPrefix {
            text: text.to_owned(),
        })?;
        let address: Ipv4Addr = address.parse().map_err(|_| SubnetError::BadAddress {
            text: text.to_owned(),
        })?;
        let prefix_len: u8 = prefix.parse().map_err(|_| SubnetError::BadPrefix {
            text: text.to_owned(),
        })?;
        Self::new(address, prefix_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipv4_packet(source: [u8; 4], destination: [u8; 4]) -> [u8; 28] {
        let mut packet = [0u8; 28];
        packet[0] = 0x45;
        packet[12..16].copy_from_slice(&source);
        packet[16..20].copy_from_slice(&destination);
        packet
    }

    #[test]
    fn endpoints_are_read_from_an_ipv4_header() {
        let packet = ipv4_packet([10, 77, 1, 2], [10, 77, 2, 2]);
        assert_eq!(
            ipv4_endpoints(&packet),
            Some((Ipv4Addr::new(10, 77, 1, 2), Ipv4Addr::new(10, 77, 2, 2)))
        );
    }

    #[test]
    fn short_and_non_ipv4_packets_have_no_endpoints() {
        let packet = ipv4_packet([10, 77, 1, 2], [10, 77, 2, 2]);
        assert_eq!(ipv4_endpoints(&packet[..19]), None);
        let mut ipv6 = packet;
        ipv6[0] = 0x60;
        assert_eq!(ipv4_endpoints(&ipv6), None);
    }

    #[test]
    fn subnets_parse_clear_host_bits_and_contain_their_hosts() {
        let subnet: Ipv4Subnet = "10.77.1.9/24".parse().expect("valid subnet");
        assert_eq!(subnet.to_string(), "10.77.1.0/24");
        assert!(subnet.contains(Ipv4Addr::new(10, 77, 1, 200)));
        assert!(!subnet.contains(Ipv4Addr::new(10, 77, 2, 1)));
        let everything: Ipv4Subnet = "0.0.0.0/0".parse().expect("valid subnet");
        assert!(everything.contains(Ipv4Addr::new(192, 0, 2, 1)));
    }

    #[test]
    fn malformed_subnets_are_rejected() {
        assert!(matches!(
            "10.0.0.0".parse::<Ipv4Subnet>(),
            Err(SubnetError::MissingPrefix { .. })
        ));
        assert!(matches!(
            "10.0.0/8".parse::<Ipv4Subnet>(),
            Err(SubnetError::BadAddress { .. })
        ));
        assert!(matches!(
            "10.0.0.0/33".parse::<Ipv4Subnet>(),
            Err(SubnetError::BadPrefix { .. })
        ));
    }
}
