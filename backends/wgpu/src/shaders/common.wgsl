// Shared helpers of every dsv4 WGSL kernel. The host prepends `alias acc = f64;` (or `f32` on a
// device without SHADER_F64) before this file: `acc` is the accumulation type of every sum, and
// the transcendental functions below are evaluated in it (WGSL's built-in exp/log/sin/cos are
// f32-only on Vulkan), so with f64 they agree with the reference's libm to about one f64 ulp.

// Every kernel gets its scalar parameters as an array of u32 words (f32 parameters travel as
// their bits) in a small read-only *storage* buffer, not a uniform buffer: lavapipe inlines
// uniform values that bound loops and compiles a shader variant per new uniform buffer, which it
// never frees (140 KB per `linear` dispatch).
struct Params { w: array<vec4<u32>, 4> }
@group(0) @binding(0) var<storage, read> P: Params;

fn pu(i: u32) -> u32 { return P.w[i / 4u][i % 4u]; }
fn pf(i: u32) -> f32 { return bitcast<f32>(pu(i)); }

// Workgroups are dispatched on a 2-D grid when one dimension would exceed 65535 groups;
// `flat_id` turns (global id, number of workgroups) back into one linear index.
fn flat_id(gid: vec3<u32>, nwg: vec3<u32>, wg: u32) -> u32 {
    return gid.x + gid.y * nwg.x * wg;
}

fn f32_nan() -> f32 { return bitcast<f32>(0x7fc00000u); }
fn f32_inf() -> f32 { return bitcast<f32>(0x7f800000u); }
fn is_nan32(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn is_inf32(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u; }

// f32::max as Rust defines it: a NaN operand is ignored.
fn rmax(a: f32, b: f32) -> f32 {
    if (is_nan32(a)) { return b; }
    if (is_nan32(b)) { return a; }
    return max(a, b);
}

// ---- bf16 / e4m3 / e2m1 / ue8m0 codecs (bit-exact with dsv4_core::codec) ----

fn bf16_to_f32(b: u32) -> f32 { return bitcast<f32>((b & 0xffffu) << 16u); }

fn f32_to_bf16(x: f32) -> u32 {
    let bits = bitcast<u32>(x);
    if (is_nan32(x)) { return ((bits >> 16u) | 0x40u) & 0xffffu; }
    let lsb = (bits >> 16u) & 1u;
    return ((bits + 0x7fffu + lsb) >> 16u) & 0xffffu;
}

// 2^e as f32 for e in -126..=127 (normal range), built from its bits.
fn pow2f(e: i32) -> f32 { return bitcast<f32>(u32(e + 127) << 23u); }

// ue8m0 scale byte → 2^(b−127); 255 is NaN. 2^-127 (b = 0) is an f32 subnormal.
fn ue8m0_to_f32(b: u32) -> f32 {
    if (b == 255u) { return f32_nan(); }
    if (b == 0u) { return bitcast<f32>(0x00400000u); }
    return bitcast<f32>(b << 23u);
}

fn e4m3_to_f32(c: u32) -> f32 {
    let mag = c & 0x7fu;
    var v: f32;
    if (mag == 0x7fu) {
        v = f32_nan();
    } else {
        let e = i32(mag >> 3u);
        let m = f32(mag & 7u);
        if (e == 0) { v = m * 0.001953125; } else { v = (1.0 + m * 0.125) * pow2f(e - 7); }
    }
    if ((c & 0x80u) != 0u) { return -v; }
    return v;
}

// e2m1 code → value (0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives), computed rather than looked up:
// lavapipe leaks memory on every dispatch of a shader that indexes a private array dynamically.
fn e2m1_to_f32(c: u32) -> f32 {
    let e = (c >> 1u) & 3u;
    let m = f32(c & 1u);
    var v = m * 0.5;
    if (e != 0u) { v = (1.0 + m * 0.5) * f32(1u << (e - 1u)); }
    if ((c & 8u) != 0u) { return -v; }
    return v;
}

// Round-to-nearest-even encoding of |x| (finite, ≥ 0) with `man` mantissa bits and `bias`,
// exactly as dsv4_core's encode_magnitude; the caller clamps to the format's largest code.
// All steps are exact in f32: scaling by powers of two and WGSL's round (ties to even).
fn encode_magnitude(x: f32, man: u32, bias: i32) -> u32 {
    if (x == 0.0) { return 0u; }
    let emin = 1 - bias;
    let bits = bitcast<u32>(x);
    let biased = i32((bits >> 23u) & 0xffu);
    if (biased == 0) { return 0u; } // f32 subnormals are far below every minifloat's half-ulp
    let ex = biased - 127;
    if (ex < emin) {
        let q = x * pow2f(i32(man) - emin);
        return u32(round(q));
    }
    let q = u32(round(x * pow2f(i32(man) - ex)));
    return (u32(ex + bias) << man) + (q - (1u << man));
}

fn f32_to_e4m3(x: f32) -> u32 {
    let bits = bitcast<u32>(x);
    let sign = (bits >> 24u) & 0x80u;
    if (is_nan32(x)) { return sign | 0x7fu; }
    if (is_inf32(x)) { return sign | 0x7eu; }
    return sign | min(encode_magnitude(abs(x), 3u, 7), 0x7eu);
}

fn f32_to_e2m1(x: f32) -> u32 {
    if (is_nan32(x)) { return 0u; }
    let bits = bitcast<u32>(x);
    let sign = (bits >> 28u) & 0x8u;
    if (is_inf32(x)) { return sign | 7u; }
    return sign | min(encode_magnitude(abs(x), 1u, 1), 7u);
}

// ceil(log2 q) for a finite positive normal f32 q (checked_pow2_ceil_exponent on q as f64).
fn ceil_log2_f32(q: f32) -> i32 {
    let bits = bitcast<u32>(q);
    let e = i32((bits >> 23u) & 0xffu) - 127;
    if ((bits & 0x7fffffu) == 0u) { return e; }
    return e + 1;
}

// dsv4_core::quant::pow2_scale_exponent: the power-of-two scale exponent of a block maximum.
// The quotient is formed in `acc` and rounded once to f32, which equals the f32 division.
fn pow2_scale_exponent(amax: f32, floor_: f32, qmax: f32) -> i32 {
    let a = rmax(amax, floor_);
    if (is_inf32(a)) { return 127; }
    let q = f32(acc(a) / acc(qmax));
    if (is_inf32(q)) { return 127; }
    if (!(q > 0.0)) { return -127; }
    return clamp(ceil_log2_f32(q), -127, 127);
}

// ---- transcendental functions in `acc` ----

const LN2_HI = 0.693147180369123816490;
const LN2_LO = 1.90821492927058770002e-10;
const INV_LN2 = 1.44269504088896338700;

// e^x: x = k·ln2 + r with |r| ≤ ln2/2 (Cody–Waite), degree-14 Taylor polynomial, then 2^k.
fn exp_acc(x0: acc) -> acc {
    if (x0 != x0) { return x0; }
    let x = clamp(x0, acc(-760.0), acc(720.0));
    let k = round(x * acc(INV_LN2));
    let r = (x - k * acc(LN2_HI)) - k * acc(LN2_LO);
    var p = acc(1.0);
    for (var i = 14; i >= 1; i = i - 1) {
        p = acc(1.0) + p * r / acc(f32(i));
    }
    let ki = i32(k);
    // Two ldexp steps keep each factor representable (subnormal results stay exact).
    let half = ki / 2;
    return ldexp(ldexp(p, half), ki - half);
}

// ln(x) for x in [1, 2] (all log1p_acc needs): x = 2^e·f with f in [√½, √2], atanh series in
// s = (f−1)/(f+1).
fn log_acc(x: acc) -> acc {
    var f = x;
    var e = 0.0;
    if (f > acc(1.41421356237309504880)) { f = f * acc(0.5); e = 1.0; }
    let s = (f - acc(1.0)) / (f + acc(1.0));
    let s2 = s * s;
    var t = acc(0.0);
    for (var n = 23; n >= 3; n = n - 2) {
        t = (t + acc(1.0) / acc(f32(n))) * s2;
    }
    let lf = acc(2.0) * s + acc(2.0) * s * t;
    return (acc(e) * acc(LN2_LO) + lf) + acc(e) * acc(LN2_HI);
}

// ln(1 + y) for y in [0, 1], accurate for small y (the u − 1 correction of Goldberg).
fn log1p_acc(y: acc) -> acc {
    let u = acc(1.0) + y;
    if (u == acc(1.0)) { return y; }
    return log_acc(u) * (y / (u - acc(1.0)));
}

fn sigmoid_acc(x: acc) -> acc { return acc(1.0) / (acc(1.0) + exp_acc(-x)); }

// sin and cos of a (|a| < 2^31·π/2): Cody–Waite reduction by π/2 in three parts, then Taylor
// polynomials on [−π/4, π/4].
fn sincos_acc(a: acc) -> vec2<acc> {
    let n = round(a * acc(0.636619772367581343076));
    let r = ((a - n * acc(1.57079632673412561417)) - n * acc(6.07710050630396597660e-11))
        - n * acc(2.02226624879595063154e-21);
    let r2 = r * r;
    var s = acc(0.0);
    var c = acc(0.0);
    for (var i = 19; i >= 3; i = i - 2) {
        s = (s + acc(1.0)) * (-r2 / acc(f32(i * (i - 1))));
        c = (c + acc(1.0)) * (-r2 / acc(f32((i - 1) * (i - 2))));
    }
    let sn = r + r * s;
    let cs = acc(1.0) + c;
    let q = i32(n - acc(4.0) * floor(n / acc(4.0)));
    switch q {
        case 0: { return vec2<acc>(sn, cs); }
        case 1: { return vec2<acc>(cs, -sn); }
        case 2: { return vec2<acc>(-sn, -cs); }
        default: { return vec2<acc>(-cs, sn); }
    }
}
