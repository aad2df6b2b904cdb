//! The kernel sources (`kernels/*.cu`, `kernels/*.cuh`), embedded in the binary, and the one
//! translation unit NVRTC and the emulator compile from them.

/// Headers, in the order they are inlined (each .cu file `#include`s them by name).
pub const HEADERS: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../kernels/common.cuh")),
    ("codec.cuh", include_str!("../kernels/codec.cuh")),
    ("lin_decode.cuh", include_str!("../kernels/lin_decode.cuh")),
    ("lin_r1.cuh", include_str!("../kernels/lin_r1.cuh")),
];

/// Kernel files.
pub const SOURCES: &[(&str, &str)] = &[
    ("linear.cu", include_str!("../kernels/linear.cu")),
    ("linear_mma.cu", include_str!("../kernels/linear_mma.cu")),
    ("rows.cu", include_str!("../kernels/rows.cu")),
    ("cache.cu", include_str!("../kernels/cache.cu")),
    ("mhc.cu", include_str!("../kernels/mhc.cu")),
    ("attention.cu", include_str!("../kernels/attention.cu")),
    ("topk.cu", include_str!("../kernels/topk.cu")),
    ("checksum.cu", include_str!("../kernels/checksum.cu")),
    ("bench.cu", include_str!("../kernels/bench.cu")),
    ("resident.cu", include_str!("../kernels/resident.cu")),
    ("moe.cu", include_str!("../kernels/moe.cu")),
];

/// Every header and kernel file in one translation unit (`translation_unit_of(SOURCES)`).
pub fn translation_unit() -> String {
    translation_unit_of(SOURCES)
}

/// The headers and `sources` (name, text) in one translation unit: headers first, then each
/// file with its `#include "<header>"` lines removed (the header is already there), each
/// preceded by a `#line` directive so compiler messages name the original file and line.
pub fn translation_unit_of(sources: &[(&str, &str)]) -> String {
    let mut tu = String::new();
    for (name, text) in HEADERS.iter().chain(sources) {
        tu.push_str(&format!("#line 1 \"{name}\"\n"));
        for line in text.lines() {
            let t = line.trim_start();
            let included = HEADERS
                .iter()
                .any(|(h, _)| t.starts_with("#include") && t.contains(&format!("\"{h}\"")));
            if included || t.starts_with("#pragma once") {
                tu.push('\n'); // keep line numbers
            } else {
                tu.push_str(line);
                tu.push('\n');
            }
        }
    }
    tu
}

/// Names of the `extern "C" __global__` kernels in the sources, in file order (comments are
/// skipped, so a comment that mentions `__global__` names nothing).
pub fn kernel_names() -> Vec<String> {
    let mut names = Vec::new();
    for (_, text) in SOURCES {
        let code = strip_comments(text);
        let mut rest = code.as_str();
        while let Some(i) = rest.find("__global__") {
            rest = &rest[i + "__global__".len()..];
            let mut decl = rest.split('(').next().unwrap_or("");
            if decl.split_whitespace().last() == Some("__launch_bounds__") {
                // `void __launch_bounds__(T, B) name(`: the name follows the bounds.
                let after = rest.find(')').map_or("", |e| &rest[e + 1..]);
                decl = after.split('(').next().unwrap_or("");
            }
            if let Some(name) = decl.split_whitespace().last() {
                names.push(name.to_string());
            }
        }
    }
    names
}

/// `text` without its `//` and `/* */` comments (string literals do not occur in kernels).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    loop {
        let line = rest.find("//");
        let block = rest.find("/*");
        let (at, is_line) = match (line, block) {
            (None, None) => {
                out.push_str(rest);
                return out;
            }
            (Some(l), Some(b)) if b < l => (b, false),
            (Some(l), _) => (l, true),
            (None, Some(b)) => (b, false),
        };
        out.push_str(&rest[..at]);
        rest = if is_line {
            rest[at..].find('\n').map_or("", |e| &rest[at + e..])
        } else {
            out.push(' ');
            rest[at + 2..]
                .find("*/")
                .map_or("", |e| &rest[at + 2 + e + 2..])
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_skip_comments_and_find_every_kernel_once() {
        let names = kernel_names();
        assert!(names.iter().any(|n| n == "linear_fp8_r1"), "{names:?}");
        assert!(names.iter().any(|n| n == "topk_select"), "{names:?}");
        // Declared with __launch_bounds__ before the name.
        assert!(names.iter().any(|n| n == "linear_mxfp4_g1"), "{names:?}");
        assert!(!names.iter().any(|n| n.starts_with("__")), "{names:?}");
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(
            sorted.len(),
            names.len(),
            "a kernel listed twice: {names:?}"
        );
        assert!(
            names
                .iter()
                .all(|n| n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        );
    }

    #[test]
    fn comments_are_stripped_line_and_block() {
        let s = strip_comments("a // __global__ x(\nb /* __global__ y( */ c\n");
        assert!(!s.contains("__global__"), "{s}");
        assert!(s.contains('a') && s.contains('b') && s.contains('c'));
    }
}
