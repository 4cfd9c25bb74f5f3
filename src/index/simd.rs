//! Dot products for the vector index, with AVX2 when the CPU has it
//! (checked once at run time) and portable code otherwise. They are written
//! with intrinsics so they stay fast in the lightly optimised build profile.

use std::sync::OnceLock;

fn has_avx2() -> bool {
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// AVX-512 VNNI on 256-bit vectors (AMD Zen 4, Intel since Ice Lake):
/// one instruction multiplies and sums four byte pairs, where AVX2 takes
/// three.
fn has_vnni() -> bool {
    static VNNI: OnceLock<bool> = OnceLock::new();
    *VNNI.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            has_avx2()
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Dot product of two equally long f32 slices.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA were detected on this CPU.
        return unsafe { avx2::dot_f32(a, b) };
    }
    dot_portable(a, b, |y| y)
}

/// The portable dot product of an f32 slice with another whose elements
/// `widen` to f32: eight accumulators, which the compiler vectorises.
fn dot_portable<T: Copy>(a: &[f32], b: &[T], widen: impl Fn(T) -> f32) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, &y)| x * widen(y))
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * widen(y[i]);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Dot product of two equally long i8 slices with values in -127..=127
/// (what [`quantize`] produces), exact in i32.
pub fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 was detected on this CPU.
        return unsafe { avx2::dot_i8(a, b) };
    }
    a.iter()
        .zip(b)
        .map(|(&x, &y)| i32::from(x) * i32::from(y))
        .sum()
}

/// [`dot_i8`] of `q` with each of the rows `rows` holds back to back
/// (`q.len()` codes each), into `out` (one per row). A partition's scan, an
/// agent's units and the centroids are such blocks: four rows at a time
/// share the query's loads and one horizontal sum, which a row at a time
/// pays each.
pub fn dots_i8(q: &[i8], rows: &[i8], out: &mut [i32]) {
    let dim = q.len();
    if dim == 0 {
        out.fill(0);
        return;
    }
    debug_assert_eq!(rows.len() / dim, out.len());
    #[cfg(target_arch = "x86_64")]
    if has_vnni() && dim.is_multiple_of(32) {
        // SAFETY: AVX2 and AVX-512 VNNI (with VL) were detected on this
        // CPU; `dim` is a whole number of 32-byte steps.
        return unsafe { vnni::dots_i8(q, rows, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() && dim.is_multiple_of(32) {
        // SAFETY: AVX2 was detected on this CPU; `dim` is a whole number
        // of 32-byte steps.
        return unsafe { avx2::dots_i8(q, rows, out) };
    }
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(dim)) {
        *o = dot_i8(q, row);
    }
}

/// Calls `visit(i, dot)` with [`dot_i8`] of `q` and each row `i` that
/// `rows` holds back to back, computed by [`dots_i8`] a block at a time
/// into a buffer on the stack: scans, centroids and an agent's units all
/// walk their dot products this way, without allocating.
#[inline]
pub fn each_dot_i8(q: &[i8], rows: &[i8], mut visit: impl FnMut(usize, i32)) {
    const BLOCK: usize = 64;
    let dim = q.len();
    if dim == 0 {
        return;
    }
    let mut dots = [0i32; BLOCK];
    for (b, block) in rows.chunks(BLOCK * dim).enumerate() {
        let dots = &mut dots[..block.len() / dim];
        dots_i8(q, &block[..dots.len() * dim], dots);
        for (i, &dot) in dots.iter().enumerate() {
            visit(b * BLOCK + i, dot);
        }
    }
}

/// Dot product of an f32 slice with an equally long i8 slice: a query
/// kept exact against a stored row kept as i8 codes (multiply by the row's
/// scale for the cosine). Only the row's rounding is left in the result.
pub fn dot_f32_i8(a: &[f32], b: &[i8]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA were detected on this CPU.
        return unsafe { avx2::dot_f32_i8(a, b) };
    }
    dot_portable(a, b, f32::from)
}

/// Asks the CPU to start loading `data` into cache (a hint; nothing on
/// other architectures). Used a few rows ahead when rows are visited in an
/// order the hardware prefetcher cannot guess.
pub fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        let start = data.as_ptr().cast::<i8>();
        for offset in (0..std::mem::size_of_val(data)).step_by(64) {
            // SAFETY: the offset stays inside `data`; a prefetch only
            // hints, it never faults or reads.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    start.add(offset),
                )
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// Moves `v`'s elements into a fresh allocation that the kernel is asked
/// to back with huge pages (Linux, where transparent huge pages are on
/// "always" or "madvise"; elsewhere a plain move). The index's per-agent
/// arrays are hundreds of MiB at a million agents, read at random: with
/// 4 KiB pages nearly every read also misses the TLB, and a prefetch that
/// misses it may be dropped. The hint must come before the pages are
/// first written, hence the fresh allocation.
pub fn on_huge_pages<T>(v: &mut Vec<T>) {
    const HUGE: usize = 2 << 20;
    let bytes = v.len() * std::mem::size_of::<T>();
    if bytes < 2 * HUGE {
        return;
    }
    let mut fresh: Vec<T> = Vec::with_capacity(v.len());
    #[cfg(target_os = "linux")]
    {
        let start = fresh.as_mut_ptr() as usize;
        let first = start.next_multiple_of(HUGE);
        let end = (start + bytes) / HUGE * HUGE;
        if end > first {
            // SAFETY: the range lies within `fresh`'s allocation, which is
            // not yet written; madvise only changes how it is backed.
            unsafe {
                libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
            }
        }
    }
    fresh.append(v);
    *v = fresh;
}

/// Gives glibc's free memory back to the system (elsewhere nothing). A
/// rebuild allocates on two threads, so in two of glibc's arenas, and frees
/// gigabytes of records and chunks on the way; on glibc alone a
/// million-agent node kept ~100 MiB more than it holds without this. The
/// `agentry` binary allocates through jemalloc, which returns freed pages
/// by itself; this still trims what RocksDB's C++ freed, and serves the
/// library on glibc (tests, embedders).
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages of the allocator's own
    // heaps to the kernel; it touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A unit vector as i8 with its scale: `v ≈ q · scale`.
pub fn quantize(v: &[f32]) -> (Vec<i8>, f32) {
    let max = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    if max == 0.0 {
        return (vec![0; v.len()], 0.0);
    }
    let scale = max / 127.0;
    (v.iter().map(|x| (x / scale).round() as i8).collect(), scale)
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::*;

    /// [`super::avx2::dots_i8`] with VNNI's byte dot product, which takes
    /// an unsigned operand: each row byte is flipped to `y + 128` (one xor),
    /// and `128 · Σq`, the same for every row, is taken off each sum.
    /// `q.len()` is a multiple of 32; codes are in -127..=127, so the
    /// products and sums stay far from i32's limits.
    #[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
    pub unsafe fn dots_i8(q: &[i8], rows: &[i8], out: &mut [i32]) {
        let dim = q.len();
        let n = out.len().min(rows.len() / dim);
        let bias = _mm_set1_epi32(128 * q.iter().map(|&x| i32::from(x)).sum::<i32>());
        let flip = _mm256_set1_epi8(i8::MIN);
        let qp = q.as_ptr();
        let row = |at: *const i8| _mm256_xor_si256(_mm256_loadu_si256(at as *const __m256i), flip);
        let mut r = 0;
        while r + 4 <= n {
            let base = rows.as_ptr().add(r * dim);
            let (mut a0, mut a1, mut a2, mut a3) = (
                _mm256_setzero_si256(),
                _mm256_setzero_si256(),
                _mm256_setzero_si256(),
                _mm256_setzero_si256(),
            );
            let mut i = 0;
            while i < dim {
                let x = _mm256_loadu_si256(qp.add(i) as *const __m256i);
                a0 = _mm256_dpbusd_epi32(a0, row(base.add(i)), x);
                a1 = _mm256_dpbusd_epi32(a1, row(base.add(dim + i)), x);
                a2 = _mm256_dpbusd_epi32(a2, row(base.add(2 * dim + i)), x);
                a3 = _mm256_dpbusd_epi32(a3, row(base.add(3 * dim + i)), x);
                i += 32;
            }
            let s01 = _mm256_hadd_epi32(a0, a1);
            let s23 = _mm256_hadd_epi32(a2, a3);
            let s = _mm256_hadd_epi32(s01, s23);
            let four = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            _mm_storeu_si128(
                out.as_mut_ptr().add(r) as *mut __m128i,
                _mm_sub_epi32(four, bias),
            );
            r += 4;
        }
        while r < n {
            out[r] = super::dot_i8(q, &rows[r * dim..(r + 1) * dim]);
            r += 1;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            acc0 = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(i)),
                _mm256_loadu_ps(b.as_ptr().add(i)),
                acc0,
            );
            acc1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(i + 8)),
                _mm256_loadu_ps(b.as_ptr().add(i + 8)),
                acc1,
            );
            i += 16;
        }
        let acc = _mm256_add_ps(acc0, acc1);
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        let mut sum: f32 = lanes.iter().sum();
        while i < n {
            sum += a[i] * b[i];
            i += 1;
        }
        sum
    }

    /// Four rows per step: each 32-byte step of the query is loaded and
    /// made positive once for the four, and the four sums leave the vector
    /// registers together. `q.len()` is a multiple of 32.
    #[target_feature(enable = "avx2")]
    pub unsafe fn dots_i8(q: &[i8], rows: &[i8], out: &mut [i32]) {
        let dim = q.len();
        let n = out.len().min(rows.len() / dim);
        let ones = _mm256_set1_epi16(1);
        let qp = q.as_ptr();
        let mut r = 0;
        // One step of one row: |x| times y with x's signs, summed in
        // pairs, then in fours into 32-bit lanes.
        let step = |ax: __m256i, x: __m256i, row: *const i8, acc: __m256i| {
            let y = _mm256_loadu_si256(row as *const __m256i);
            let pairs = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(y, x));
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, ones))
        };
        while r + 4 <= n {
            let base = rows.as_ptr().add(r * dim);
            // Four named accumulators, kept in registers across the row.
            let (mut a0, mut a1, mut a2, mut a3) = (
                _mm256_setzero_si256(),
                _mm256_setzero_si256(),
                _mm256_setzero_si256(),
                _mm256_setzero_si256(),
            );
            let mut i = 0;
            while i < dim {
                let x = _mm256_loadu_si256(qp.add(i) as *const __m256i);
                let ax = _mm256_sign_epi8(x, x);
                a0 = step(ax, x, base.add(i), a0);
                a1 = step(ax, x, base.add(dim + i), a1);
                a2 = step(ax, x, base.add(2 * dim + i), a2);
                a3 = step(ax, x, base.add(3 * dim + i), a3);
                i += 32;
            }
            // Lanes of rows 0..4 summed pairwise, then the halves added:
            // one vector of the four dot products.
            let s01 = _mm256_hadd_epi32(a0, a1);
            let s23 = _mm256_hadd_epi32(a2, a3);
            let s = _mm256_hadd_epi32(s01, s23);
            let four = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            _mm_storeu_si128(out.as_mut_ptr().add(r) as *mut __m128i, four);
            r += 4;
        }
        while r < n {
            out[r] = dot_i8(q, &rows[r * dim..(r + 1) * dim]);
            r += 1;
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_f32_i8(a: &[f32], b: &[i8]) -> f32 {
        let n = a.len().min(b.len());
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= n {
            let codes = _mm_loadl_epi64(b.as_ptr().add(i) as *const __m128i);
            let y = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes));
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i)), y, acc);
            i += 8;
        }
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        let mut sum: f32 = lanes.iter().sum();
        while i < n {
            sum += a[i] * f32::from(b[i]);
            i += 1;
        }
        sum
    }

    /// Values must lie in -127..=127 (as [`super::quantize`] makes them):
    /// 32 products per step through `maddubs`, which multiplies unsigned by
    /// signed bytes, so `a`'s sign moves onto `b` first; a pair of products
    /// is at most 2 · 127² and fits its i16 lane.
    #[target_feature(enable = "avx2")]
    pub unsafe fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
        let n = a.len().min(b.len());
        let ones = _mm256_set1_epi16(1);
        let mut acc = _mm256_setzero_si256();
        let mut i = 0;
        while i + 32 <= n {
            let x = _mm256_loadu_si256(a.as_ptr().add(i) as *const __m256i);
            let y = _mm256_loadu_si256(b.as_ptr().add(i) as *const __m256i);
            let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, ones));
            i += 32;
        }
        while i + 16 <= n {
            let x = _mm256_cvtepi8_epi16(_mm_loadu_si128(a.as_ptr().add(i) as *const __m128i));
            let y = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.as_ptr().add(i) as *const __m128i));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(x, y));
            i += 16;
        }
        let mut lanes = [0i32; 8];
        _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, acc);
        let mut sum: i32 = lanes.iter().sum();
        while i < n {
            sum += i32::from(a[i]) * i32::from(b[i]);
            i += 1;
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_agree_with_plain_arithmetic() {
        let a: Vec<f32> = (0..259)
            .map(|i| ((i * 37) % 17) as f32 / 7.0 - 1.0)
            .collect();
        let b: Vec<f32> = (0..259)
            .map(|i| ((i * 11) % 13) as f32 / 5.0 - 1.2)
            .collect();
        let plain: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot_f32(&a, &b) - plain).abs() < 1e-3);
        let (qa, sa) = quantize(&a);
        let (qb, sb) = quantize(&b);
        let plain_i: i32 = qa
            .iter()
            .zip(&qb)
            .map(|(&x, &y)| i32::from(x) * i32::from(y))
            .sum();
        assert_eq!(dot_i8(&qa, &qb), plain_i);
        let plain_mixed: f32 = a.iter().zip(&qb).map(|(x, &y)| x * f32::from(y)).sum();
        assert!((dot_f32_i8(&a, &qb) - plain_mixed).abs() < 1e-2);
        assert!((dot_f32_i8(&a, &qb) * sb - plain).abs() < 0.01 * plain.abs().max(1.0));
        // Extremes of the range, where a pair of products nears i16::MAX.
        let hi: Vec<i8> = (0..259)
            .map(|i| if i % 3 == 0 { -127 } else { 127 })
            .collect();
        let lo: Vec<i8> = (0..259)
            .map(|i| if i % 2 == 0 { -127 } else { 127 })
            .collect();
        for (x, y) in [(&hi, &hi), (&hi, &lo), (&lo, &hi)] {
            let plain: i32 = x
                .iter()
                .zip(y)
                .map(|(&p, &q)| i32::from(p) * i32::from(q))
                .sum();
            assert_eq!(dot_i8(x, y), plain);
        }
        // Blocks of rows: every count of rows around the four a step takes,
        // with dimensions the fast path takes (multiples of 32) and not.
        for dim in [32, 64, 256, 259] {
            let q: Vec<i8> = (0..dim)
                .map(|i| ((i * 53) % 255) as i8)
                .map(|v| v.max(-127))
                .collect();
            for n in 0..10 {
                let rows: Vec<i8> = (0..n * dim)
                    .map(|i| ((i * 29 + 7) % 255) as i8)
                    .map(|v| v.max(-127))
                    .collect();
                let mut out = vec![i32::MIN; n];
                dots_i8(&q, &rows, &mut out);
                let plain: Vec<i32> = rows.chunks_exact(dim).map(|r| dot_i8(&q, r)).collect();
                assert_eq!(out, plain, "dim {dim}, {n} rows");
            }
        }
        let extremes: Vec<i8> = hi
            .iter()
            .chain(&lo)
            .chain(&hi)
            .chain(&lo)
            .copied()
            .collect();
        let mut out = vec![0; 4];
        dots_i8(
            &hi[..256],
            &extremes
                .chunks_exact(259)
                .flat_map(|r| &r[..256])
                .copied()
                .collect::<Vec<_>>(),
            &mut out,
        );
        let each: Vec<i32> = extremes
            .chunks_exact(259)
            .map(|r| dot_i8(&hi[..256], &r[..256]))
            .collect();
        assert_eq!(out, each);
        let approx = dot_i8(&qa, &qb) as f32 * sa * sb;
        assert!(
            (approx - plain).abs() < 0.02 * plain.abs().max(1.0),
            "{approx} vs {plain}"
        );
    }
}
