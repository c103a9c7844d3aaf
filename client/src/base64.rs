//! Standard base64 (RFC 4648, with padding) for binary values in JSON and
//! CSV, by the `base64` crate.

use ::base64::Engine as _;
use ::base64::engine::general_purpose::STANDARD;

pub fn encode(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// The inverse of [`encode`]; `None` for anything that is not canonical
/// padded base64 (wrong length, misplaced padding, a character outside the
/// alphabet, or non-zero bits after the last byte), so each value has
/// exactly one accepted encoding.
pub fn decode(text: &str) -> Option<Vec<u8>> {
    STANDARD.decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc4648_vectors() {
        let vectors = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, encoded) in vectors {
            assert_eq!(encode(plain.as_bytes()), encoded);
            assert_eq!(decode(encoded).unwrap(), plain.as_bytes());
        }
    }

    #[test]
    fn every_byte_value_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        let encoded = encode(&all);
        assert!(encoded.starts_with("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8g"));
        assert_eq!(decode(&encoded).unwrap(), all);
        for len in 0..all.len() {
            assert_eq!(decode(&encode(&all[..len])).unwrap(), &all[..len]);
        }
    }

    #[test]
    fn rejects_malformed_input() {
        assert_eq!(decode("Zg="), None);
        assert_eq!(decode("Z==="), None);
        assert_eq!(decode("Zg==Zg=="), None);
        assert_eq!(decode("Zm9!"), None);
        // "Zh==" would also give "f" if the spare bits were ignored.
        assert_eq!(decode("Zh=="), None);
        assert_eq!(decode("Zg"), None);
    }
}
