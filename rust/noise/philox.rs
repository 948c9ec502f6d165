//! The Philox4x32-10 counter-based generator (Salmon, Moraes, Dror and Shaw, "Parallel Random Numbers: As
//! Easy as 1, 2, 3", SC 2011, §4.2): a 128-bit counter and a 64-bit key give 128 random bits by ten rounds of
//!
//! ```text
//!   (hi₀, lo₀) = M₀ · c₀,  (hi₁, lo₁) = M₁ · c₂            (32 × 32 → 64-bit products)
//!   c ← (hi₁ ⊕ c₁ ⊕ k₀,  lo₁,  hi₀ ⊕ c₃ ⊕ k₁,  lo₀)
//!   k ← (k₀ + W₀,  k₁ + W₁)                               (between rounds)
//! ```
//!
//! with M₀ = 0xD2511F53, M₁ = 0xCD9E8D57, W₀ = 0x9E3779B9, W₁ = 0xBB67AE85. Integer operations only, so a
//! group of counters runs in vector lanes and every code path gives the same bits.

/// The round multipliers M₀, M₁ and the key increments W₀, W₁.
const M0: u64 = 0xD251_1F53;
const M1: u64 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;
const ROUNDS: usize = 10;

/// The low 32 bits of a lane.
const LOW: u64 = 0xFFFF_FFFF;

/// Philox4x32-10 of L counters at once: `counters[w][l]` is 32-bit word w of lane l's counter, held in the low
/// half of a 64-bit lane (the high half zero, so that each 32 × 32 → 64-bit product is one vector multiply of
/// 64-bit lanes), `key` = (k₀, k₁); the 128 output bits of each lane replace its counter, as 32-bit words.
#[inline(always)]
pub(super) fn philox4x32<const L: usize>(counters: &mut [[u64; L]; 4], key: [u32; 2]) {
    let mut k = key;
    for round in 0..ROUNDS {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let [c0, c1, c2, c3] = *counters;
        for l in 0..L {
            let p0 = M0 * (c0[l] & LOW);
            let p1 = M1 * (c2[l] & LOW);
            counters[0][l] = (p1 >> 32) ^ c1[l] ^ k[0] as u64;
            counters[1][l] = p1 & LOW;
            counters[2][l] = (p0 >> 32) ^ c3[l] ^ k[1] as u64;
            counters[3][l] = p0 & LOW;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The three `philox4x32 10` known-answer vectors of the Random123 distribution (`tests/kat_vectors`):
    /// counter, key, output.
    const KNOWN_ANSWERS: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
        ([0; 4], [0; 2], [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]),
        (
            [u32::MAX; 4],
            [u32::MAX; 2],
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd],
        ),
        (
            [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
            [0xa409_3822, 0x299f_31d0],
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1],
        ),
    ];

    #[test]
    fn the_known_answers_of_the_reference_implementation_in_every_lane() {
        for (counter, key, expected) in KNOWN_ANSWERS {
            let mut lanes = [[0u64; 3]; 4];
            for (w, &c) in counter.iter().enumerate() {
                lanes[w] = [c as u64; 3];
            }
            philox4x32(&mut lanes, key);
            for l in 0..3 {
                assert_eq!(
                    [lanes[0][l], lanes[1][l], lanes[2][l], lanes[3][l]],
                    expected.map(u64::from)
                );
            }
        }
    }
}
