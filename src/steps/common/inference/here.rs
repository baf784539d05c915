//! What this machine runs (`vidflow engines`): the CPU and the vector extensions the engines
//! choose their kernels by, and each engine with the precisions it computes in here. A pipeline
//! that pins a precision this lists for no engine is a `validate` error; a list of precisions
//! (`precision = ["bf16", "f32"]`) takes the first one listed here.

use super::{Backend, Precision, openvino, runtimes};

/// The extensions that decide which precisions run, and how fast: (name as /proc/cpuinfo
/// spells it, whether this CPU says it has it).
#[cfg(target_arch = "x86_64")]
fn extensions() -> Vec<(&'static str, bool)> {
    vec![
        ("avx2", std::arch::is_x86_feature_detected!("avx2")),
        ("fma", std::arch::is_x86_feature_detected!("fma")),
        ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
        (
            "avx512_vnni",
            std::arch::is_x86_feature_detected!("avx512vnni"),
        ),
        ("avx_vnni", std::arch::is_x86_feature_detected!("avxvnni")),
        (
            "avx512_bf16",
            std::arch::is_x86_feature_detected!("avx512bf16"),
        ),
        ("amx_bf16", amx_bf16()),
    ]
}

/// CPUID leaf 7's AMX-BF16 bit (EDX 22): std does not detect AMX in a stable release yet.
#[cfg(target_arch = "x86_64")]
fn amx_bf16() -> bool {
    let leaf = std::arch::x86_64::__cpuid_count(7, 0);
    leaf.edx & (1 << 22) != 0
}

#[cfg(not(target_arch = "x86_64"))]
fn extensions() -> Vec<(&'static str, bool)> {
    Vec::new()
}

/// The CPU's model name, from /proc/cpuinfo.
fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// An engine's version and the precisions it runs here, or why it cannot run.
type State = Result<(String, Vec<Precision>), String>;

/// Each engine, and its state.
pub(in crate::steps) fn engines() -> Vec<(Backend, State)> {
    let opencv = opencv::core::get_version_string()
        .map(|v| (v, vec![Precision::F32]))
        .map_err(|e| e.to_string());
    let onnxruntime = runtimes::onnxruntime()
        .map(|v| (v.to_owned(), vec![Precision::F32, Precision::Int8]))
        .map_err(str::to_owned);
    let openvino = runtimes::openvino()
        .map_err(str::to_owned)
        .and_then(|v| Ok((v.to_owned(), openvino::precisions_here()?)));
    vec![
        (Backend::OpenCv, opencv),
        (Backend::OnnxRuntime, onnxruntime),
        (Backend::OpenVino, openvino),
    ]
}

/// `vidflow engines`: the CPU, then a line an engine.
pub(in crate::steps) fn report() -> String {
    let (has, lacks): (Vec<_>, Vec<_>) = extensions().into_iter().partition(|e| e.1);
    let names = |list: &[(&str, bool)]| list.iter().map(|e| e.0).collect::<Vec<_>>().join(" ");
    let mut out = format!("cpu: {}: {}", cpu_name(), names(&has));
    if !lacks.is_empty() {
        out.push_str(&format!(" (no {})", names(&lacks)));
    }
    out.push('\n');
    for (backend, state) in engines() {
        match state {
            Ok((version, precisions)) => {
                let list: Vec<&str> = precisions.iter().map(|p| p.name()).collect();
                out.push_str(&format!(
                    "{} {version}: {}\n",
                    backend.name(),
                    list.join(" ")
                ));
            }
            Err(why) => out.push_str(&format!("{}: {why}\n", backend.name())),
        }
    }
    out
}
