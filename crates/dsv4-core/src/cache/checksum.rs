//! The page checksum of the canary (`debug.canary`): a 64-bit FNV-style fold over a page's
//! little-endian 8-byte words, then its trailing bytes. Every backend that checksums pages on a
//! device (the CUDA canary kernel) must give these exact values.

/// The canary checksum of one page's bytes.
pub fn page_checksum(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let v = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        h = (h ^ v).wrapping_mul(0x0100_0000_01b3).rotate_left(29);
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::page_checksum;

    #[test]
    fn one_changed_byte_anywhere_changes_the_checksum() {
        let page: Vec<u8> = (0..77u32).map(|i| (i * 31 % 251) as u8).collect();
        let base = page_checksum(&page);
        for i in 0..page.len() {
            let mut p = page.clone();
            p[i] ^= 0x10;
            assert_ne!(page_checksum(&p), base, "byte {i}");
        }
        assert_eq!(page_checksum(&[]), 0xcbf2_9ce4_8422_2325);
    }
}
