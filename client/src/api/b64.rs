//! Standard base64 (RFC 4648's alphabet, padded), as API.md's `value_b64` carries a value that
//! is not UTF-8 text.
//!
//! Encoding and decoding use the CPU's vector instructions where it has them (`base64-simd`):
//! a 1 KiB value decodes in about a third of the time the `base64` crate's scalar engine takes,
//! and encodes in a sixth, which a leader pays for every record a JSON client publishes or
//! pulls.
//! What is accepted does not change with it: a value the vector decoder refuses is decoded
//! again by the scalar engine, which decides and gives the error, so a value is accepted
//! exactly when the scalar engine (`STANDARD`: padding required, no bits left over in the last
//! character) accepts it. The tests hold the vector decoder to never accepting what the scalar
//! one refuses, and both to the same bytes.

use base64::Engine as _;

/// The bytes `text` encodes, or why it is not standard base64.
pub fn decode(text: &[u8]) -> Result<Vec<u8>, base64::DecodeError> {
    match base64_simd::STANDARD.decode_to_vec(text) {
        Ok(bytes) => Ok(bytes),
        Err(_) => base64::engine::general_purpose::STANDARD.decode(text),
    }
}

/// `bytes` in standard base64.
pub fn encode(bytes: &[u8]) -> String {
    base64_simd::STANDARD.encode_to_string(bytes)
}

/// Appends `bytes` in standard base64 to `out`.
pub fn encode_append(bytes: &[u8], out: &mut Vec<u8>) {
    base64_simd::STANDARD.encode_append(bytes, out);
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;

    const SCALAR: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

    /// A small deterministic generator (xorshift), so that a failure names its case.
    struct Gen(u64);
    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn encodes_as_the_scalar_engine_does() {
        let mut g = Gen(7);
        for len in 0..600 {
            let bytes: Vec<u8> = (0..len).map(|_| g.next() as u8).collect();
            let mut appended = b"x".to_vec();
            super::encode_append(&bytes, &mut appended);
            assert_eq!(super::encode(&bytes), SCALAR.encode(&bytes), "length {len}");
            assert_eq!(
                &appended[1..],
                SCALAR.encode(&bytes).as_bytes(),
                "length {len}"
            );
        }
    }

    /// Valid encodings of every length up to 300 bytes, and each mutated where the two
    /// decoders could differ: the last three characters (padding and the bits left over), one
    /// character anywhere, the padding taken off or added, the text cut short; mutations drawn
    /// from the alphabet, padding, the URL-safe alphabet, whitespace and a stray byte.
    #[test]
    fn accepts_exactly_what_the_scalar_engine_accepts() {
        const CHARS: &[u8] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_ \n\r\t.\xff";
        let mut g = Gen(99);
        let (mut accepted, mut refused) = (0, 0);
        for len in 0..300 {
            for _ in 0..20 {
                let bytes: Vec<u8> = (0..len).map(|_| g.next() as u8).collect();
                let text = SCALAR.encode(&bytes).into_bytes();
                let mut cases = vec![text.clone()];
                for k in 0..4 {
                    if text.is_empty() {
                        break;
                    }
                    let mut c = text.clone();
                    let at = if k < 3 {
                        c.len().saturating_sub(1 + k)
                    } else {
                        g.next() as usize % c.len()
                    };
                    c[at] = CHARS[g.next() as usize % CHARS.len()];
                    cases.push(c);
                }
                let mut c = text.clone();
                while c.last() == Some(&b'=') {
                    c.pop();
                }
                cases.push(c.clone());
                for _ in 0..3 {
                    c.push(b'=');
                    cases.push(c.clone());
                }
                let mut c = text.clone();
                c.truncate(c.len().saturating_sub(1 + g.next() as usize % 3));
                cases.push(c);
                for case in cases {
                    let vector = base64_simd::STANDARD.decode_to_vec(&case).ok();
                    let scalar = SCALAR.decode(&case).ok();
                    if scalar.is_none() {
                        assert_eq!(vector, None, "the vector decoder accepted {case:?}");
                    }
                    let ours = super::decode(&case);
                    assert_eq!(ours.as_ref().ok(), scalar.as_ref(), "{case:?}");
                    match ours {
                        Ok(_) => accepted += 1,
                        Err(_) => refused += 1,
                    }
                }
            }
        }
        // Both kinds were tried in numbers.
        assert!(
            accepted > 10_000 && refused > 10_000,
            "{accepted} / {refused}"
        );
    }

    #[test]
    fn an_error_is_the_scalar_engines() {
        let err = super::decode(b"QUJD*A==").unwrap_err();
        assert_eq!(err, SCALAR.decode(b"QUJD*A==").unwrap_err());
        assert_eq!(err.to_string(), "Invalid symbol 42, offset 4.");
    }
}
