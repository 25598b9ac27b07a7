//! Parity arithmetic: P (XOR) and Q (Reed-Solomon syndrome over GF(2^8),
//! generator 2, polynomial x^8+x^4+x^3+x^2+1) as Linux md computes them,
//! and the recovery of one or two lost columns from them.
//!
//! Written here rather than taken from an erasure-coding crate because
//! those compute other codes (Vandermonde or FFT based), whose first
//! parity is not the XOR of the data: RAID6 needs P to be plain XOR (a
//! RAID5-style fast path) and Q to be the md syndrome (so a scrub can name
//! the member that is wrong). The hot loops work eight bytes at a time.

use std::sync::OnceLock;

struct Tables {
    exp: [u8; 512],
    log: [u8; 256],
}

fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        let mut exp = [0u8; 512];
        let mut log = [0u8; 256];
        let mut x: u16 = 1;
        for (i, e) in exp.iter_mut().enumerate().take(255) {
            *e = x as u8;
            log[x as usize] = i as u8;
            x <<= 1;
            if x & 0x100 != 0 {
                x ^= 0x11d;
            }
        }
        for i in 255..512 {
            exp[i] = exp[i - 255];
        }
        Tables { exp, log }
    })
}

/// `a * b` in GF(2^8).
pub fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        return 0;
    }
    let t = tables();
    t.exp[t.log[a as usize] as usize + t.log[b as usize] as usize]
}

/// `1 / a` in GF(2^8); `a` is not zero.
pub fn inv(a: u8) -> u8 {
    let t = tables();
    t.exp[255 - t.log[a as usize] as usize]
}

/// `2^n` in GF(2^8).
pub fn pow2(n: usize) -> u8 {
    tables().exp[n % 255]
}

/// Every byte of `v` multiplied by 2.
#[inline]
fn mul2_lanes(v: u64) -> u64 {
    let high = v & 0x8080_8080_8080_8080;
    let reduce = (high >> 7).wrapping_mul(0x1d);
    ((v << 1) & 0xfefe_fefe_fefe_fefe) ^ reduce
}

#[inline]
fn mul2(b: u8) -> u8 {
    (b << 1) ^ if b & 0x80 != 0 { 0x1d } else { 0 }
}

/// `dst ^= src`.
pub fn xor_into(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len());
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (d8, s8) in (&mut d).zip(&mut s) {
        let v =
            u64::from_ne_bytes(d8.try_into().unwrap()) ^ u64::from_ne_bytes(s8.try_into().unwrap());
        d8.copy_from_slice(&v.to_ne_bytes());
    }
    for (a, b) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *a ^= b;
    }
}

/// `q = q * 2 ^ d`: one Horner step of the Q syndrome.
fn q_step(q: &mut [u8], d: &[u8]) {
    assert_eq!(q.len(), d.len());
    #[cfg(target_arch = "x86_64")]
    let (q, d) = {
        let done = q_step_sse2(q, d);
        (&mut q[done..], &d[done..])
    };
    q_step_lanes(q, d);
}

/// [`q_step`] sixteen bytes at a time with SSE2 (every x86_64 CPU has
/// it); returns the bytes done, a multiple of 16.
#[cfg(target_arch = "x86_64")]
fn q_step_sse2(q: &mut [u8], d: &[u8]) -> usize {
    use std::arch::x86_64::*;
    let n = q.len().min(d.len()) / 16 * 16;
    // SAFETY: SSE2 is part of x86_64; every load and store stays inside
    // the first `n` bytes of `q` and `d`, unaligned accesses throughout.
    unsafe {
        let poly = _mm_set1_epi8(0x1d);
        let zero = _mm_setzero_si128();
        let (qp, dp) = (q.as_mut_ptr(), d.as_ptr());
        let mut i = 0;
        while i < n {
            let v = _mm_loadu_si128(qp.add(i) as *const __m128i);
            // Bytes with the top bit set (negative as i8) reduce by 0x1d.
            let high = _mm_cmpgt_epi8(zero, v);
            let doubled = _mm_xor_si128(_mm_add_epi8(v, v), _mm_and_si128(high, poly));
            let x = _mm_loadu_si128(dp.add(i) as *const __m128i);
            _mm_storeu_si128(qp.add(i) as *mut __m128i, _mm_xor_si128(doubled, x));
            i += 16;
        }
    }
    n
}

/// [`q_step`] eight bytes at a time in a `u64`.
fn q_step_lanes(q: &mut [u8], d: &[u8]) {
    let mut qc = q.chunks_exact_mut(8);
    let mut dc = d.chunks_exact(8);
    for (q8, d8) in (&mut qc).zip(&mut dc) {
        let v = mul2_lanes(u64::from_ne_bytes(q8.try_into().unwrap()))
            ^ u64::from_ne_bytes(d8.try_into().unwrap());
        q8.copy_from_slice(&v.to_ne_bytes());
    }
    for (a, b) in qc.into_remainder().iter_mut().zip(dc.remainder()) {
        *a = mul2(*a) ^ b;
    }
}

/// `dst ^= c * src` for a constant `c`.
pub fn mul_xor_into(dst: &mut [u8], src: &[u8], c: u8) {
    let mut table = [0u8; 256];
    for (x, t) in table.iter_mut().enumerate() {
        *t = mul(x as u8, c);
    }
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= table[*s as usize];
    }
}

/// `buf = c * buf`.
pub fn scale(buf: &mut [u8], c: u8) {
    let mut table = [0u8; 256];
    for (x, t) in table.iter_mut().enumerate() {
        *t = mul(x as u8, c);
    }
    for b in buf.iter_mut() {
        *b = table[*b as usize];
    }
}

/// P of `data` (equal-length columns, column `i` is data disk `i`).
pub fn p_of(data: &[&[u8]], p: &mut [u8]) {
    p.fill(0);
    for d in data {
        xor_into(p, d);
    }
}

/// Q of `data`: the sum of `2^i * D_i`. A missing column counts as zeros.
pub fn q_of(data: &[Option<&[u8]>], q: &mut [u8]) {
    q.fill(0);
    for d in data.iter().rev() {
        match d {
            Some(d) => q_step(q, d),
            None => scale(q, 2),
        }
    }
}

/// Recovers data columns `x < y` into `dx`, `dy` from P and Q, and the
/// other data columns (`others` has `None` at `x` and `y`).
pub fn recover_two_data(
    others: &[Option<&[u8]>],
    p: &[u8],
    q: &[u8],
    x: usize,
    y: usize,
    dx: &mut [u8],
    dy: &mut [u8],
) {
    // pxy = P + Dx + Dy and qxy = Q' + Q = 2^x Dx + 2^y Dy.
    let mut pxy = p.to_vec();
    for d in others.iter().flatten() {
        xor_into(&mut pxy, d);
    }
    let mut qxy = vec![0u8; q.len()];
    q_of(others, &mut qxy);
    xor_into(&mut qxy, q);
    // Dx = A*pxy + B*qxy with A = 2^(y-x)/(2^(y-x)+1), B = 2^-x/(2^(y-x)+1).
    let gyx = pow2(y - x);
    let denom = inv(gyx ^ 1);
    let a = mul(gyx, denom);
    let b = mul(inv(pow2(x)), denom);
    dx.fill(0);
    mul_xor_into(dx, &pxy, a);
    mul_xor_into(dx, &qxy, b);
    dy.copy_from_slice(&pxy);
    xor_into(dy, dx);
}

/// Recovers data column `x` from Q and the other data columns.
pub fn recover_data_from_q(others: &[Option<&[u8]>], q: &[u8], x: usize, dx: &mut [u8]) {
    q_of(others, dx);
    xor_into(dx, q);
    scale(dx, inv(pow2(x)));
}

/// For a stripe whose P and Q both disagree with its data: the data
/// column that, alone wrong, explains both (`None` if no single one does).
pub fn locate_bad_data(data: &[&[u8]], p: &[u8], q: &[u8]) -> Option<usize> {
    let columns: Vec<Option<&[u8]>> = data.iter().map(|d| Some(*d)).collect();
    let mut pd = vec![0u8; p.len()];
    p_of(data, &mut pd);
    xor_into(&mut pd, p);
    let mut qd = vec![0u8; q.len()];
    q_of(&columns, &mut qd);
    xor_into(&mut qd, q);
    // With Dz off by e: pd = e, qd = 2^z e, at every byte where e != 0.
    let t = tables();
    let mut found = None;
    for (a, b) in pd.iter().zip(&qd) {
        match (*a, *b) {
            (0, 0) => continue,
            (0, _) | (_, 0) => return None,
            (a, b) => {
                let z = (t.log[b as usize] as usize + 255 - t.log[a as usize] as usize) % 255;
                if z >= data.len() || found.is_some_and(|f| f != z) {
                    return None;
                }
                found = Some(z);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn columns(n: usize, len: usize, seed: u8) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                (0..len)
                    .map(|j| (j as u8).wrapping_mul(31) ^ seed ^ (i as u8 * 7))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn multiplication_agrees_with_repeated_doubling() {
        for a in 0..=255u8 {
            let mut x = a;
            for n in 0..10 {
                assert_eq!(mul(a, pow2(n)), x);
                x = mul2(x);
            }
            if a != 0 {
                assert_eq!(mul(a, inv(a)), 1);
            }
        }
    }

    #[test]
    fn q_steps_agree_with_bytewise_doubling() {
        for len in [0, 7, 16, 33, 4096 + 5] {
            let q0: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let d: Vec<u8> = (0..len).map(|i| (i * 101 + 3) as u8).collect();
            let mut q = q0.clone();
            q_step(&mut q, &d);
            let want: Vec<u8> = q0.iter().zip(&d).map(|(a, b)| mul2(*a) ^ b).collect();
            assert_eq!(q, want, "{len} bytes");
        }
    }

    #[test]
    fn lanes_double_like_bytes() {
        let v: [u8; 8] = [0, 1, 0x80, 0xff, 0x7f, 0x8e, 0x1d, 0xc3];
        let w = mul2_lanes(u64::from_ne_bytes(v)).to_ne_bytes();
        for i in 0..8 {
            assert_eq!(w[i], mul2(v[i]));
        }
    }

    #[test]
    fn any_two_data_columns_come_back() {
        let data = columns(6, 37, 5);
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let mut p = vec![0; 37];
        let mut q = vec![0; 37];
        p_of(&refs, &mut p);
        q_of(&refs.iter().map(|d| Some(*d)).collect::<Vec<_>>(), &mut q);
        for x in 0..6 {
            for y in x + 1..6 {
                let others: Vec<Option<&[u8]>> = refs
                    .iter()
                    .enumerate()
                    .map(|(i, d)| (i != x && i != y).then_some(*d))
                    .collect();
                let (mut dx, mut dy) = (vec![0; 37], vec![0; 37]);
                recover_two_data(&others, &p, &q, x, y, &mut dx, &mut dy);
                assert_eq!(dx, data[x]);
                assert_eq!(dy, data[y]);
            }
            let others: Vec<Option<&[u8]>> = refs
                .iter()
                .enumerate()
                .map(|(i, d)| (i != x).then_some(*d))
                .collect();
            let mut dx = vec![0; 37];
            recover_data_from_q(&others, &q, x, &mut dx);
            assert_eq!(dx, data[x]);
        }
    }

    #[test]
    fn a_corrupt_data_column_is_located() {
        let mut data = columns(5, 64, 9);
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let (mut p, mut q) = (vec![0; 64], vec![0; 64]);
        p_of(&refs, &mut p);
        q_of(&refs.iter().map(|d| Some(*d)).collect::<Vec<_>>(), &mut q);
        assert_eq!(locate_bad_data(&refs, &p, &q), None);
        data[3][10] ^= 0x55;
        data[3][40] ^= 0x01;
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        assert_eq!(locate_bad_data(&refs, &p, &q), Some(3));
    }
}
