//! The shapes of the one-row linear kernels (`_r1`, `_g1`; kernels/lin_r1.cuh): how many output
//! columns a warp computes, how many warps a block has (its warps share one staged tile of the
//! input row) and how many rounds of weight loads a lane keeps in flight. Every shape gives a column the same bits; which one is fastest depends on the
//! GPU, so kernels/linear.cu compiles a few for fp8 and MXFP4 weights, `DSV4_CUDA_DECODE`
//! picks one per format, and `dsv4 bench` times them all.

use dsv4_kernels::WeightFormat;

/// Environment variable choosing the decode shapes, as `backend.cuda_decode` does in a profile:
/// `fp8=c1w8,mxfp4=c1w8p3` (each format optional; unset or empty: every format's default, the
/// first of [`DecodeShape::compiled`]).
pub const DECODE_ENV: &str = "DSV4_CUDA_DECODE";

/// One decode kernel's shape: `cols` output columns a warp, `warps` warps a block, `depth`
/// rounds of weight loads in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeShape {
    /// Output columns one warp computes, sharing each input chunk.
    pub cols: u32,
    /// Warps of a block, sharing one staged tile of the input row.
    pub warps: u32,
    /// Rounds of weight loads a lane has in flight while it adds a chunk (lin_r1.cuh's DEPTH).
    pub depth: u32,
}

const fn shape(cols: u32, warps: u32) -> DecodeShape {
    deep(cols, warps, 1)
}

const fn deep(cols: u32, warps: u32, depth: u32) -> DecodeShape {
    DecodeShape { cols, warps, depth }
}

/// fp8 shapes kernels/linear.cu compiles, default first (`lin_r1<LIN_FP8>`, then the `_cCwW`
/// and `_cCwWpD` kernels).
const FP8: &[DecodeShape] = &[
    shape(2, 8),
    shape(2, 4),
    shape(4, 4),
    shape(1, 8),
    deep(2, 8, 2),
    deep(2, 8, 3),
    deep(1, 8, 3),
];
/// MXFP4 shapes, default first.
const MXFP4: &[DecodeShape] = &[
    shape(4, 4),
    shape(2, 4),
    shape(2, 8),
    deep(2, 4, 2),
    deep(1, 8, 3),
];
/// bf16 and f32 weights: one shape.
const OTHER: &[DecodeShape] = &[shape(4, 4)];

impl DecodeShape {
    /// The shapes compiled for `format`, its default first.
    pub fn compiled(format: WeightFormat) -> &'static [DecodeShape] {
        match format {
            WeightFormat::Fp8Block => FP8,
            WeightFormat::Mxfp4 => MXFP4,
            WeightFormat::Bf16 | WeightFormat::F32 => OTHER,
        }
    }

    /// `format`'s default shape.
    pub fn default_for(format: WeightFormat) -> DecodeShape {
        Self::compiled(format)[0]
    }

    /// The shape's name, `cCwW` (`c2w4`), with `pD` appended for a depth above one (`c2w8p4`).
    pub fn name(self) -> String {
        match self.depth {
            1 => format!("c{}w{}", self.cols, self.warps),
            d => format!("c{}w{}p{d}", self.cols, self.warps),
        }
    }

    /// The shape named `s` (`c2w4`, `c2w8p4`), whether compiled or not.
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = || format!("`{s}` is not a decode shape: expected cCwW or cCwWpD, e.g. c2w4");
        let rest = s.trim().strip_prefix('c').ok_or_else(bad)?;
        let (c, rest) = rest.split_once('w').ok_or_else(bad)?;
        let (w, d) = rest.split_once('p').unwrap_or((rest, "1"));
        let n = |t: &str| t.parse::<u32>().ok().filter(|&v| v > 0).ok_or_else(bad);
        Ok(deep(n(c)?, n(w)?, n(d)?))
    }

    /// Output columns one block computes.
    pub fn block_cols(self) -> usize {
        (self.cols * self.warps) as usize
    }

    /// Threads of one block.
    pub fn threads(self) -> u32 {
        self.warps * 32
    }

    /// The name of the decode kernel of weight format `fmt` (`fp8`) with this shape, one row
    /// (`_r1`) or grouped (`_g1`): `linear_fp8_r1` for the default shape, else with the
    /// shape's name appended (`linear_fp8_r1_c1w8`).
    pub fn kernel(self, format: WeightFormat, fmt: &str, grouped: bool) -> String {
        let kind = if grouped { "g1" } else { "r1" };
        if self == Self::default_for(format) {
            format!("linear_{fmt}_{kind}")
        } else {
            format!("linear_{fmt}_{kind}_{}", self.name())
        }
    }
}

/// The decode shape the backend launches for each weight format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeShapes {
    fp8: DecodeShape,
    mxfp4: DecodeShape,
}

impl Default for DecodeShapes {
    fn default() -> Self {
        Self {
            fp8: DecodeShape::default_for(WeightFormat::Fp8Block),
            mxfp4: DecodeShape::default_for(WeightFormat::Mxfp4),
        }
    }
}

impl DecodeShapes {
    /// The shape of `format`'s decode kernels.
    pub fn of(&self, format: WeightFormat) -> DecodeShape {
        match format {
            WeightFormat::Fp8Block => self.fp8,
            WeightFormat::Mxfp4 => self.mxfp4,
            WeightFormat::Bf16 | WeightFormat::F32 => DecodeShape::default_for(format),
        }
    }

    /// These shapes with `format`'s set to `shape`, which must be one compiled for it.
    pub fn with(mut self, format: WeightFormat, shape: DecodeShape) -> Result<Self, String> {
        let compiled = DecodeShape::compiled(format);
        if !compiled.contains(&shape) {
            let names: Vec<String> = compiled.iter().map(|s| s.name()).collect();
            return Err(format!(
                "no {} decode kernels of shape {}: compiled are {} (the first is the default)",
                format_key(format),
                shape.name(),
                names.join(", ")
            ));
        }
        match format {
            WeightFormat::Fp8Block => self.fp8 = shape,
            WeightFormat::Mxfp4 => self.mxfp4 = shape,
            WeightFormat::Bf16 | WeightFormat::F32 => {}
        }
        Ok(self)
    }

    /// The shapes `spec` asks for: comma-separated `format=shape` pairs (`fp8=c1w8,mxfp4=c1w8p3`;
    /// formats f32, bf16, fp8, mxfp4, each at most once), the rest at their defaults.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut out = Self::default();
        let mut seen: Vec<&str> = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("`{part}` is not format=shape (e.g. fp8=c1w8)"))?;
            let format = match key.trim() {
                "f32" => WeightFormat::F32,
                "bf16" => WeightFormat::Bf16,
                "fp8" => WeightFormat::Fp8Block,
                "mxfp4" => WeightFormat::Mxfp4,
                other => {
                    return Err(format!(
                        "unknown weight format `{other}`: expected f32, bf16, fp8 or mxfp4"
                    ));
                }
            };
            if seen.contains(&key.trim()) {
                return Err(format!(
                    "`{}` names a shape twice: give each weight format once",
                    spec.trim()
                ));
            }
            seen.push(key.trim());
            out = out.with(format, DecodeShape::parse(value)?)?;
        }
        Ok(out)
    }

    /// `fp8=c2w8,mxfp4=c4w4`: what [`DecodeShapes::parse`] reads back.
    pub fn describe(&self) -> String {
        format!("fp8={},mxfp4={}", self.fp8.name(), self.mxfp4.name())
    }
}

/// The name `DSV4_CUDA_DECODE` and the kernels give `format`.
pub(crate) fn format_key(format: WeightFormat) -> &'static str {
    match format {
        WeightFormat::F32 => "f32",
        WeightFormat::Bf16 => "bf16",
        WeightFormat::Fp8Block => "fp8",
        WeightFormat::Mxfp4 => "mxfp4",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use WeightFormat::{Bf16, Fp8Block, Mxfp4};

    #[test]
    fn shapes_parse_and_name_their_kernels() {
        let s = DecodeShapes::parse(" fp8=c1w8 , mxfp4=c2w8").unwrap();
        assert_eq!(s.of(Fp8Block), shape(1, 8));
        assert_eq!(s.of(Mxfp4), shape(2, 8));
        assert_eq!(s.describe(), "fp8=c1w8,mxfp4=c2w8");
        assert_eq!(DecodeShapes::parse(&s.describe()).unwrap(), s);
        let d = DecodeShapes::parse("fp8=c2w8p3,mxfp4=c1w8p3").unwrap();
        assert_eq!(d.of(Fp8Block), deep(2, 8, 3));
        assert_eq!(d.describe(), "fp8=c2w8p3,mxfp4=c1w8p3");
        assert_eq!(
            d.of(Mxfp4).kernel(Mxfp4, "mxfp4", true),
            "linear_mxfp4_g1_c1w8p3"
        );
        // Depth 1 is the plain name, written out or not.
        assert_eq!(DecodeShape::parse("c2w4p1").unwrap(), shape(2, 4));
        assert_eq!(DecodeShapes::parse("").unwrap(), DecodeShapes::default());
        assert_eq!(
            DecodeShapes::parse("bf16=c4w4").unwrap(),
            DecodeShapes::default()
        );
        assert_eq!(
            s.of(Fp8Block).kernel(Fp8Block, "fp8", false),
            "linear_fp8_r1_c1w8"
        );
        let d = DecodeShape::default_for(Mxfp4);
        assert_eq!(d.kernel(Mxfp4, "mxfp4", true), "linear_mxfp4_g1");
        assert_eq!((d.block_cols(), d.threads()), (16, 128));
        assert_eq!(shape(2, 8).block_cols(), 16);
    }

    #[test]
    fn bad_shapes_say_what_is_compiled() {
        let err = |s: &str| DecodeShapes::parse(s).unwrap_err();
        assert_eq!(
            err("fp8=c3w4"),
            "no fp8 decode kernels of shape c3w4: compiled are c2w8, c2w4, c4w4, c1w8, c2w8p2, \
             c2w8p3, c1w8p3 (the first is the default)"
        );
        assert!(
            err("bf16=c2w8").contains("compiled are c4w4"),
            "{}",
            err("bf16=c2w8")
        );
        assert_eq!(
            err("fp4=c2w4"),
            "unknown weight format `fp4`: expected f32, bf16, fp8 or mxfp4"
        );
        assert_eq!(err("fp8"), "`fp8` is not format=shape (e.g. fp8=c1w8)");
        assert_eq!(
            err("fp8=c2w8, mxfp4=c4w4,fp8=c1w8"),
            "`fp8=c2w8, mxfp4=c4w4,fp8=c1w8` names a shape twice: give each weight format once"
        );
        for bad in [
            "fp8=2w4",
            "fp8=c2",
            "fp8=c0w4",
            "fp8=cxw4",
            "fp8=c2w-1",
            "fp8=c2w8p",
            "fp8=c2w8p0",
            "fp8=c2w8p4p2",
        ] {
            assert!(
                err(bad).contains("is not a decode shape"),
                "{bad}: {}",
                err(bad)
            );
        }
    }

    #[test]
    fn every_compiled_fp8_shape_keeps_a_block_inside_one_scale_block() {
        // lin_r1.cuh's static_assert: the prescaled tile serves one 128-row scale block.
        for s in DecodeShape::compiled(Fp8Block) {
            assert_eq!(128 % s.block_cols(), 0, "{}", s.name());
        }
        assert_eq!(DecodeShape::compiled(Bf16), &[shape(4, 4)]);
    }

    #[test]
    fn the_listed_shapes_are_the_compiled_kernels() {
        let names = crate::kernels::kernel_names();
        let mut listed = Vec::new();
        for format in [WeightFormat::F32, Bf16, Fp8Block, Mxfp4] {
            for s in DecodeShape::compiled(format) {
                for grouped in [false, true] {
                    listed.push(s.kernel(format, format_key(format), grouped));
                }
            }
        }
        for k in &listed {
            assert!(
                names.contains(k),
                "{k} is listed but not in kernels/linear.cu"
            );
        }
        // And every shaped decode kernel of the sources is listed.
        for n in names
            .iter()
            .filter(|n| n.contains("_r1_c") || n.contains("_g1_c"))
        {
            assert!(
                listed.contains(n),
                "{n} is compiled but not in DecodeShape::compiled"
            );
        }
    }
}
