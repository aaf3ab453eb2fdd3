//! Builds the stub drivers (`stubs/`): `libcuda.so.1` and
//! `libamdhip64.so.5` (each symbol at the version the real library gives it:
//! `hip_4.2` to `hip_5.1`, see `stubs/hip.map`), shared libraries that a
//! test loads in place of a real driver by putting their folder first on
//! `LD_LIBRARY_PATH` in a child process. The folder is passed to the crate
//! as `CACHEALLOC_STUB_DIR` (empty where the stubs cannot be built: not Linux).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=stubs");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("stubs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        println!("cargo:rustc-env=CACHEALLOC_STUB_DIR=");
        return;
    }
    let src =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir")).join("stubs");
    let cc = cc::Build::new().get_compiler();
    let cuda = out.join("cuda");
    build(&cc, &src.join("cuda_stub.c"), &cuda, "libcuda.so.1", None);
    link(&cuda, "libcuda.so.1", "libcuda.so");
    build(
        &cc,
        &src.join("hip_stub.c"),
        &out.join("hip"),
        "libamdhip64.so.5",
        Some(&src.join("hip.map")),
    );
    // Every name the HIP backend tries, so that the stub (first on
    // LD_LIBRARY_PATH) is found before a ROCm installed on the machine.
    for alias in ["libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so"] {
        link(&out.join("hip"), "libamdhip64.so.5", alias);
    }
    println!("cargo:rustc-env=CACHEALLOC_STUB_DIR={}", out.display());
}

/// Compile one stub into `dir/soname`.
fn build(cc: &cc::Tool, source: &Path, dir: &Path, soname: &str, version_script: Option<&Path>) {
    std::fs::create_dir_all(dir).expect("stub folder");
    let mut cmd = Command::new(cc.path());
    cmd.args([
        "-shared",
        "-fPIC",
        "-O1",
        "-g",
        "-std=c11",
        "-D_GNU_SOURCE",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-fvisibility=hidden",
        "-pthread",
    ])
    .arg(format!("-Wl,-soname,{soname}"));
    if let Some(map) = version_script {
        cmd.arg(format!("-Wl,--version-script={}", map.display()));
    }
    cmd.arg("-o").arg(dir.join(soname)).arg(source);
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {}: {e}", cc.path().display()));
    assert!(status.success(), "compiling {} failed", source.display());
}

/// `dir/alias` -> `target` (the development name a loader may try).
fn link(dir: &Path, target: &str, alias: &str) {
    let path = dir.join(alias);
    let _ = std::fs::remove_file(&path);
    std::os::unix::fs::symlink(target, &path).expect("symlink");
}
