//! Builds the fake CANN (`fake/*.c`) into `OUT_DIR/fake-cann` when the `fake-cann` feature is
//! on, and tells the crate where it is (`EPLB_FAKE_CANN_DIR`). Without the feature it does
//! nothing: production builds need neither a C compiler nor CANN.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "fake-cann")]
    fake::build();
}

#[cfg(feature = "fake-cann")]
mod fake {
    use std::path::{Path, PathBuf};
    use std::process::Command;

    pub fn build() {
        for f in ["fake/fake_cann.h", "fake/fake_acl.c", "fake/fake_hccl.c"] {
            println!("cargo:rerun-if-changed={f}");
        }
        let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"))
            .join("fake-cann");
        std::fs::create_dir_all(&out).expect("create OUT_DIR/fake-cann");
        let compiler = cc::Build::new()
            .cargo_metadata(false)
            .opt_level(1)
            .get_compiler();
        link(
            &compiler,
            &out,
            "libascendcl.so",
            &["fake/fake_acl.c"],
            &["-lpthread"],
        );
        link(
            &compiler,
            &out,
            "libhccl.so",
            &["fake/fake_hccl.c"],
            // Same state as the fake ACL: DT_NEEDED on it, found next to this file.
            &[
                "-L",
                path(&out),
                "-lascendcl",
                "-Wl,-rpath,$ORIGIN",
                "-lpthread",
            ],
        );
        println!("cargo:rustc-env=EPLB_FAKE_CANN_DIR={}", out.display());
    }

    fn path(p: &Path) -> &str {
        p.to_str().expect("OUT_DIR is valid UTF-8")
    }

    fn link(compiler: &cc::Tool, out: &Path, name: &str, sources: &[&str], extra: &[&str]) {
        let mut cmd: Command = compiler.to_command();
        cmd.args([
            "-shared",
            "-fPIC",
            "-std=gnu11",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wno-format-nonliteral",
            "-Wno-format-security",
            "-fvisibility=hidden",
            "-Ifake",
        ]);
        cmd.arg(format!("-Wl,-soname,{name}"));
        cmd.arg("-o").arg(out.join(name));
        cmd.args(sources);
        cmd.args(extra);
        let status = cmd
            .status()
            .unwrap_or_else(|e| panic!("running the C compiler for the fake CANN: {e}"));
        assert!(
            status.success(),
            "building the fake CANN {name} failed: {cmd:?}"
        );
    }
}
