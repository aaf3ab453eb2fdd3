//! The C library from outside, as C programs and PyTorch see it:
//!
//! - `header`: `include/cachealloc.h` is what cbindgen makes of the sources
//!   (`CACHEALLOC_BLESS=1` rewrites it);
//! - `c_abi_on_the_simulated_device`: `tests/c/abi_test.c`, compiled with
//!   the system C compiler (`-Wall -Wextra -Werror`, every entry point
//!   assigned to PyTorch's function types) against the header and linked
//!   with the cdylib cargo built for this test, runs with
//!   `CACHEALLOC_BACKEND=mock`: sizes 0 / 1000 / 30 MiB, record_stream, out
//!   of memory with PyTorch's message, the hooks, snapshots, bad frees, a
//!   forced internal error, 8 threads of random alloc/free pairs checked
//!   for overlap; its statistics must equal those of the same sequence run
//!   on the allocator here, and its snapshot must pass the project's
//!   snapshot checker;
//! - `c_abi_on_the_cuda_stub`: the same program on the CUDA backend, over
//!   the project's stub `libcuda.so.1`;
//! - `cpp_pool_hooks_through_std_function`: the pool hooks called the way
//!   PyTorch's bindings call them (`reinterpret_cast` to
//!   `void(*)(int, std::pair<unsigned long long, unsigned long long>)`,
//!   wrapped in `std::function`);
//! - `ipc_on_the_simulated_device`, `ipc_between_two_processes_on_the_cuda_stub`:
//!   `tests/c/ipc_test.c`, sharing a block between devices of one simulated
//!   machine, then between two processes over the stub driver (the second
//!   process is the same program, started by the first); peer access and
//!   device-to-device copies;
//! - `readme_example`: `examples/hello.c`, built and run with the README's
//!   commands.

use cachealloc_core::{BlockSlot, Config, DeviceAllocator};
use cachealloc_mock::MockDevice;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The folder of the cdylib cargo built for this test (`libcachealloc.so`
/// beside the test executable, in `deps/`).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable");
    let deps = exe.parent().expect("its folder").to_path_buf();
    for dir in [deps.clone(), deps.join("..")] {
        if dir.join("libcachealloc.so").exists() {
            return dir;
        }
    }
    panic!(
        "no libcachealloc.so beside {} (cargo builds the cdylib for integration tests)",
        exe.display()
    );
}

/// A scratch folder of its own for test `name`.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("capi")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    dir
}

/// Run `cmd`, failing the test with its output unless it succeeds.
fn run(cmd: &mut Command, what: &str) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{text}",
        out.status
    );
    out
}

/// Compile C (or C++ with `cxx`) `source` into `out`, against the header
/// and the library.
fn compile(source: &Path, out: &Path, cxx: bool) {
    let (var, default, std) = if cxx {
        ("CXX", "c++", "-std=c++17")
    } else {
        ("CC", "cc", "-std=c11")
    };
    let compiler = std::env::var(var).unwrap_or_else(|_| default.to_string());
    let lib = lib_dir();
    let mut cmd = Command::new(&compiler);
    cmd.args([std, "-Wall", "-Werror", "-g", "-pthread"]);
    if !cxx {
        cmd.arg("-Wextra");
    }
    // The library of this build has the test hooks (`cargo test
    // --workspace` turns them on): the programs' failure-path checks run.
    if cfg!(feature = "debug-hooks") {
        cmd.arg("-DCACHEALLOC_DEBUG_HOOKS");
    }
    cmd.arg("-I")
        .arg(manifest_dir().join("include"))
        .arg(source)
        .arg("-o")
        .arg(out)
        .arg(format!("-L{}", lib.display()))
        // DT_RPATH, not RUNPATH: it wins over LD_LIBRARY_PATH, which cargo
        // sets to target/debug too, where an older libcachealloc.so (from
        // a `cargo build`) would otherwise be loaded instead of this test's.
        .arg(format!("-Wl,-rpath,{},--disable-new-dtags", lib.display()))
        .args(["-lcachealloc", "-ldl"]);
    run(&mut cmd, &format!("compiling {}", source.display()));
}

/// A command for `exe` with the settings cleared, then `backend`'s.
fn program(exe: &Path, backend: &str) -> Command {
    let mut cmd = Command::new(exe);
    for v in [
        "CACHEALLOC_CONF",
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_HIP_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF",
        "CACHEALLOC_TORCH_VERSION",
        "CACHEALLOC_SLOTS",
        "CACHEALLOC_HISTORY_CAPACITY",
        "CACHEALLOC_MOCK_CAPACITY",
    ] {
        cmd.env_remove(v);
    }
    cmd.env("CACHEALLOC_BACKEND", backend);
    // A smaller arena than the default (the test needs few blocks).
    cmd.env("CACHEALLOC_SLOTS", "65536");
    cmd
}

// ------------------------------------------------------------------ header

/// The header cbindgen makes of the sources with `cbindgen.toml`.
fn generated_header() -> String {
    let dir = manifest_dir();
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .with_src(table_functions())
        .generate()
        .expect("cbindgen parses the sources");
    let mut out = Vec::new();
    bindings.write(&mut out);
    noexcept_callbacks(&String::from_utf8(out).expect("UTF-8"))
}

/// A source file of the C functions the operation table makes (`shims.rs`
/// makes them with a macro, which cbindgen does not expand): their
/// declarations as the table gives them.
fn table_functions() -> PathBuf {
    let mut src = String::from("use std::ffi::{c_int, c_void};\n");
    for f in cachealloc_core::OPERATIONS.iter().flat_map(|op| op.c) {
        for line in f.docs {
            src.push_str(&format!("///{line}\n"));
        }
        let result = match f.result {
            "" => String::new(),
            r => format!(" -> {r}"),
        };
        src.push_str(&format!(
            "#[no_mangle]\npub extern \"C\" fn {}({}){result} {{}}\n\n",
            f.name, f.params
        ));
    }
    // One file per caller: tests that make the header run side by side.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("capi");
    std::fs::create_dir_all(&dir).expect("scratch folder");
    let path = dir.join(format!(
        "table_functions-{:?}.rs",
        std::thread::current().id()
    ));
    std::fs::write(&path, src).expect("write the table's functions");
    path
}

/// With `CACHEALLOC_BLESS` set, write `fresh` to `path` (false: nothing
/// more to check); else fail, naming the first line that differs, unless
/// `path` holds `fresh` (`what`: what `fresh` is).
fn blessed_or_same(path: &Path, fresh: &str, what: &str) -> bool {
    if std::env::var_os("CACHEALLOC_BLESS").is_some() {
        std::fs::write(path, fresh).expect("write the generated file");
        return false;
    }
    let current = std::fs::read_to_string(path).unwrap_or_default();
    if current != fresh {
        let (line, (was, now)) = current
            .lines()
            .chain(std::iter::repeat(""))
            .zip(fresh.lines().chain(std::iter::repeat("")))
            .enumerate()
            .find(|(_, (a, b))| a != b)
            .unwrap_or((0, ("", "")));
        panic!(
            "{} is not {what} (line {}: {was:?}, now {now:?}); refresh it with\n  \
             CACHEALLOC_BLESS=1 cargo test -p cachealloc-capi --test capi -- header python_prototypes",
            path.display(),
            line + 1
        );
    }
    true
}

/// Every function-pointer type and member of `header` marked
/// `CACHEALLOC_NOEXCEPT` (cbindgen cannot say it): C++ then refuses a
/// callback that is not `noexcept`.
fn noexcept_callbacks(header: &str) -> String {
    let mut out = String::with_capacity(header.len() + 1024);
    for line in header.lines() {
        let code = line.trim_start();
        let pointer = !code.starts_with(['*', '/']) && code.contains("(*") && code.ends_with(");");
        match line.strip_suffix(';').filter(|_| pointer) {
            Some(decl) => out.push_str(&format!("{decl} CACHEALLOC_NOEXCEPT;")),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[test]
fn header() {
    let path = manifest_dir().join("include/cachealloc.h");
    let fresh = generated_header();
    if !blessed_or_same(&path, &fresh, "what cbindgen makes of the sources") {
        return;
    }
    // Every exported function is declared, after its comment.
    let lines: Vec<&str> = fresh.lines().collect();
    for name in [
        "cachealloc_alloc",
        "cachealloc_free",
        "cachealloc_init",
        "cachealloc_reset",
        "cachealloc_snapshot",
        "cachealloc_last_error",
    ] {
        let at = lines
            .iter()
            .position(|l| {
                !l.starts_with([' ', '/']) && l.contains(&format!(" {name}("))
                    || l.contains(&format!("*{name}("))
            })
            .unwrap_or_else(|| panic!("{name} is not declared"));
        assert!(
            at > 0 && lines[at - 1].ends_with("*/"),
            "{name} has no comment"
        );
    }
}

/// The Python package's ctypes prototypes (`python/cachealloc/_prototypes.py`)
/// are made from the header, as the header is made from the sources: every
/// function with its result and argument types, every callback type. Fails
/// when the checked-in file differs; refresh it with
/// `CACHEALLOC_BLESS=1 cargo test -p cachealloc-capi --test capi python_prototypes`.
#[test]
fn python_prototypes() {
    let path = manifest_dir().join("../python/cachealloc/_prototypes.py");
    if !path.parent().is_some_and(Path::is_dir) {
        println!("no python/cachealloc beside this crate (a packaged copy): skipped");
        return;
    }
    let fresh = prototypes_of(&generated_header());
    blessed_or_same(&path, &fresh, "what the header makes");
}

/// The structures the Python package mirrors (`_structs.py`): a pointer to
/// one is a `POINTER` of its class; to any other, `c_void_p`.
const MIRRORED: [(&str, &str); 4] = [
    ("cachealloc_pool_memory", "PoolMemory"),
    ("cachealloc_fragmentation", "Fragmentation"),
    ("cachealloc_oom_cause", "OomCause"),
    ("cachealloc_ipc_handle", "IpcHandle"),
];

/// The Python name of callback type `typedef_name` (`cachealloc_stat_callback`:
/// `STAT_CALLBACK`).
fn callback_name(typedef_name: &str) -> String {
    typedef_name
        .trim_start_matches("cachealloc_")
        .to_ascii_uppercase()
}

/// The ctypes type of C type `c` (as the header spells it, without a
/// parameter name), given the callback types declared so far.
fn ctypes_of(c: &str, callbacks: &[String]) -> String {
    let c = c
        .replace("const ", "")
        .replace(" *", "*")
        .trim()
        .to_string();
    if let Some(pointee) = c.strip_suffix('*') {
        let pointee = pointee.trim();
        return match pointee {
            "char" => "c_char_p".to_string(),
            "size_t" => "POINTER(c_size_t)".to_string(),
            "int" => "POINTER(c_int)".to_string(),
            _ => match MIRRORED.iter().find(|(n, _)| *n == pointee) {
                Some((_, class)) => format!("POINTER({class})"),
                None => "c_void_p".to_string(),
            },
        };
    }
    match c.as_str() {
        "void" => "None".to_string(),
        "int" => "c_int".to_string(),
        "double" => "c_double".to_string(),
        "size_t" => "c_size_t".to_string(),
        "int64_t" => "c_int64".to_string(),
        "uint64_t" => "c_uint64".to_string(),
        "uint32_t" => "c_uint32".to_string(),
        other if callbacks.iter().any(|n| n == other) => callback_name(other),
        other => panic!("no ctypes type for the C type {other:?}: teach ctypes_of"),
    }
}

/// The C type of a named parameter (`const cachealloc_ipc_pages *h`: its
/// type, `const cachealloc_ipc_pages *`).
fn param_type(param: &str) -> String {
    let param = param.trim();
    let name_at = param
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    param[..name_at].trim().to_string()
}

/// `_prototypes.py` for `header`.
fn prototypes_of(header: &str) -> String {
    // The header's statements, outside comments, preprocessor lines and
    // structure bodies, each with whether it is under the test hooks' #if.
    let mut statements: Vec<(String, bool)> = Vec::new();
    let mut constants: Vec<(String, String)> = Vec::new();
    let (mut current, mut in_comment, mut depth, mut hooks) = (String::new(), false, 0i32, false);
    for line in header.lines() {
        let t = line.trim();
        if in_comment {
            in_comment = !t.contains("*/");
            continue;
        }
        if t.starts_with("/*") {
            in_comment = !t.contains("*/");
            continue;
        }
        if let Some(def) = t.strip_prefix("#define ") {
            // The integer constants (status codes, flags), once each.
            if let Some((name, value)) = def.split_once(' ') {
                if value.parse::<i64>().is_ok() && !constants.iter().any(|(n, _)| n == name) {
                    constants.push((name.to_string(), value.to_string()));
                }
            }
            continue;
        }
        if t.starts_with('#') {
            if t.contains("CACHEALLOC_DEBUG_HOOKS") {
                hooks = true;
            } else if t.starts_with("#endif") {
                hooks = false;
            }
            continue;
        }
        if t.is_empty()
            || t.starts_with("//")
            || t.starts_with("extern \"C\"")
            || t.starts_with("}  //")
        {
            continue;
        }
        depth += t.matches('{').count() as i32 - t.matches('}').count() as i32;
        if t.contains('{') || t.contains('}') || depth > 0 {
            continue;
        }
        current.push_str(t);
        current.push(' ');
        if t.ends_with(';') {
            statements.push((current.trim().trim_end_matches(';').to_string(), hooks));
            current.clear();
        }
    }
    let mut callbacks: Vec<String> = Vec::new();
    let mut out = String::from(
        "\"\"\"The integer constants, the callback types and the prototype of every\n\
         function of libcachealloc's C header (capi/include/cachealloc.h), for ctypes.\n\n\
         Generated from the header by capi/tests/capi.rs (`python_prototypes`): do\n\
         not edit. Refresh: CACHEALLOC_BLESS=1 cargo test -p cachealloc-capi --test capi\n\
         python_prototypes\n\"\"\"\n\n\
         from ctypes import CFUNCTYPE, POINTER, c_char_p, c_double, c_int, c_int64, c_size_t, c_uint32, c_uint64, c_void_p  # noqa: F401\n\n\
         from ._structs import Fragmentation, IpcHandle, OomCause, PoolMemory  # noqa: F401\n\n",
    );
    for (name, value) in &constants {
        out.push_str(&format!("{name} = {value}\n"));
    }
    out.push('\n');
    let (mut plain, mut debug) = (String::new(), String::new());
    for (s, hooks) in &statements {
        if let Some(rest) = s.strip_prefix("typedef ") {
            // typedef R (*NAME)(ARGS) CACHEALLOC_NOEXCEPT
            let Some((ret, rest)) = rest.split_once("(*") else {
                continue;
            };
            let (name, rest) = rest.split_once(")(").expect("a callback type");
            let args = rest.split_once(')').expect("its arguments").0;
            let types: Vec<String> = std::iter::once(ctypes_of(ret, &callbacks))
                .chain(args.split(',').map(|a| ctypes_of(a, &callbacks)))
                .collect();
            out.push_str(&format!(
                "#: ``{name}``\n{} = CFUNCTYPE({})\n",
                callback_name(name),
                types.join(", ")
            ));
            callbacks.push(name.to_string());
            continue;
        }
        let Some((head, args)) = s.split_once('(') else {
            continue;
        };
        let args = args.trim_end().trim_end_matches(')');
        let name_at = head.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
        let (ret, name) = match name_at {
            Some(i) => (&head[..=i], &head[i + 1..]),
            None => continue,
        };
        if !name.starts_with("cachealloc_") {
            continue;
        }
        let argtypes: Vec<String> = if args.trim() == "void" {
            Vec::new()
        } else {
            args.split(',')
                .map(|a| ctypes_of(&param_type(a), &callbacks))
                .collect()
        };
        let line = format!(
            "    \"{name}\": ({}, [{}]),\n",
            ctypes_of(ret, &callbacks),
            argtypes.join(", ")
        );
        if *hooks {
            debug.push_str(&line);
        } else {
            plain.push_str(&line);
        }
    }
    out.push_str(&format!(
        "\n#: The C library's test hooks: only a library built with the cargo feature\n\
         #: ``debug-hooks`` has them.\nDEBUG_PROTOTYPES = {{\n{debug}}}\n\n\
         #: name: (restype, argtypes), in the header's order.\nPROTOTYPES = {{\n{plain}}}\n"
    ));
    out
}

/// The C library's files form no circle: what each file of `capi/src`
/// names of another (`crate::NAME`, in a `use` line or a path) makes a
/// graph, which must have no loop (the devices and their machinery at the
/// bottom, the features above, the C functions on top).
#[test]
fn the_c_library_files_form_no_circle() {
    let src = manifest_dir().join("src");
    let mut graph: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(&src).expect("capi/src") {
        let path = entry.expect("an entry").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let name = path
            .file_stem()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(&path).expect("read");
        let mut deps: Vec<String> = text
            .match_indices("crate::")
            .map(|(i, m)| {
                text[i + m.len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect::<String>()
            })
            .filter(|d| !d.is_empty() && *d != name)
            .collect();
        deps.sort();
        deps.dedup();
        graph.insert(name, deps);
    }
    assert!(graph.len() > 10, "{graph:?}");
    // Depth-first, with the path so far: a name met again on it is a loop.
    fn visit(
        n: &str,
        graph: &BTreeMap<String, Vec<String>>,
        path: &mut Vec<String>,
        done: &mut Vec<String>,
    ) {
        if let Some(at) = path.iter().position(|p| p == n) {
            panic!("capi/src has a circle: {} -> {n}", path[at..].join(" -> "));
        }
        if done.iter().any(|d| d == n) {
            return;
        }
        path.push(n.to_string());
        for d in graph.get(n).into_iter().flatten() {
            visit(d, graph, path, done);
        }
        path.pop();
        done.push(n.to_string());
    }
    let mut done = Vec::new();
    for n in graph.keys() {
        visit(n, &graph, &mut Vec::new(), &mut done);
    }
}

/// The functions the header declares, with those declared only under
/// `CACHEALLOC_DEBUG_HOOKS` when `hooks`.
fn declared_functions(header: &str, hooks: bool) -> Vec<String> {
    let mut in_hooks = false;
    let mut names: Vec<String> = header
        .lines()
        .filter(|l| {
            if l.starts_with("#if defined(CACHEALLOC_DEBUG_HOOKS)") {
                in_hooks = true;
            } else if l.starts_with("#endif") {
                in_hooks = false;
            }
            hooks || !in_hooks
        })
        // A declaration's first line (cbindgen wraps long ones after a comma).
        .filter(|l| {
            !l.starts_with([' ', '/', '#', '}', 't'])
                && l.contains('(')
                && (l.ends_with(");") || l.ends_with(','))
        })
        .filter_map(|l| {
            let name = l.split('(').next()?.rsplit([' ', '*']).next()?;
            Some(name.to_string())
        })
        .collect();
    names.sort();
    names
}

/// Every out-of-memory class (`oom_classes!`, the one list) is named with
/// its number in the header, in the Python package and in docs/oom.md's
/// table: a new class cannot be missed in one of them.
#[test]
fn every_oom_class_is_named_in_the_header_python_and_the_docs() {
    let read = |p: &str| std::fs::read_to_string(manifest_dir().join(p)).expect(p);
    let header = read("include/cachealloc.h").replace("\n     * ", " ");
    let python = read("../python/cachealloc/stats.py").replace("\n    ", " ");
    let docs = read("../docs/oom.md");
    for c in cachealloc_core::OomClass::ALL {
        let name = c.as_str();
        assert!(
            header.contains(&format!("{} {name}", c.index())),
            "the header's cachealloc_oom_cause does not name class {} {name}",
            c.index()
        );
        assert!(
            python.contains(&format!("``{name}``")),
            "python/cachealloc/stats.py (last_oom_cause) does not name {name}"
        );
        assert!(
            docs.contains(&format!("| `{name}` |")),
            "docs/oom.md's table has no row for {name}"
        );
    }
}

/// The C functions that are no device operation of the table: the
/// library's own (its version, backend, errors, settings, PyTorch's init
/// hook) and the observers, which every device shares.
const LIBRARY_FUNCTIONS: [&str; 9] = [
    "cachealloc_attach_oom_cause_observer",
    "cachealloc_attach_oom_observer",
    "cachealloc_attach_oom_rejection_observer",
    "cachealloc_backend",
    "cachealloc_get_allocator_settings",
    "cachealloc_init",
    "cachealloc_last_error",
    "cachealloc_last_error_code",
    "cachealloc_version",
];

/// Each C function of the header is an operation's, as the operation
/// table says (made from it, or written by hand and named there), or one
/// of the library's own: a new C function is found in the table.
#[test]
fn every_c_function_is_in_the_operation_table() {
    let header =
        std::fs::read_to_string(manifest_dir().join("include/cachealloc.h")).expect("the header");
    let declared = declared_functions(&header, false);
    let ops = cachealloc_core::OPERATIONS;
    let made: Vec<&str> = ops.iter().flat_map(|op| op.c).map(|f| f.name).collect();
    let by_hand: Vec<&str> = ops.iter().flat_map(|op| op.by_hand).copied().collect();
    for name in made.iter().chain(&by_hand) {
        assert!(
            declared.iter().any(|d| d == name),
            "the operation table names {name}, which the header does not declare"
        );
    }
    for name in &declared {
        assert!(
            made.contains(&name.as_str())
                || by_hand.contains(&name.as_str())
                || LIBRARY_FUNCTIONS.contains(&name.as_str()),
            "{name} is neither in the operation table (core/src/operations.rs) nor one of \
             the library's own functions"
        );
    }
    assert!(made.len() >= 15, "{made:?}");
}

#[test]
fn the_library_exports_what_the_header_declares() {
    let header =
        std::fs::read_to_string(manifest_dir().join("include/cachealloc.h")).expect("the header");
    let hooks = cfg!(feature = "debug-hooks");
    let declared = declared_functions(&header, hooks);
    assert!(declared.len() >= 20, "{declared:?}");
    // The test hooks are declared only for programs built against a
    // library that has them.
    let all = declared_functions(&header, true);
    let hook_names: Vec<&String> = all.iter().filter(|n| n.contains("_debug_")).collect();
    assert_eq!(hook_names.len(), 2, "{all:?}");
    assert!(
        hook_names
            .iter()
            .all(|n| !declared_functions(&header, false).contains(n)),
        "a debug hook is declared outside #if defined(CACHEALLOC_DEBUG_HOOKS)"
    );
    let lib = lib_dir().join("libcachealloc.so");
    let out = match Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
    {
        Ok(o) if o.status.success() => o,
        _ => {
            println!("no nm on this machine: skipped");
            return;
        }
    };
    let mut exported: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (kind, name) = (f.nth(1)?, f.next()?);
            (kind == "T").then(|| name.to_string())
        })
        .collect();
    exported.sort();
    assert_eq!(exported, declared, "nm -D --defined-only {}", lib.display());
}

// ------------------------------------------------------------- the C test

/// The sequence of `sequence()` in abi_test.c, on the allocator directly:
/// its statistics.
fn sequence_stats(side_stream: u64) -> BTreeMap<String, i64> {
    let slots = vec![BlockSlot::VACANT; 1 << 16].into_boxed_slice();
    let mut a = DeviceAllocator::new(MockDevice::with_capacity(GIB), slots, Config::DEFAULT);
    assert!(a.malloc(0, 0).expect("0 bytes").handle.is_none());
    let small = a.malloc(1000, 0).expect("small").handle.expect("id");
    let large = a.malloc(30 * MIB, 0).expect("large");
    let side = a
        .malloc(1000, side_stream)
        .expect("side")
        .handle
        .expect("id");
    a.record_stream(small, side_stream).expect("record_stream");
    a.free(small).expect("free small");
    a.free(large.handle.expect("id")).expect("free large");
    let again = a.malloc(30 * MIB, 0).expect("again");
    assert_eq!(again.ptr, large.ptr);
    assert!(a.malloc(2 * GIB, 0).is_err());
    a.free(side).expect("free side");
    a.free(again.handle.expect("id")).expect("free again");
    a.empty_cache().expect("empty_cache");
    let mut stats = BTreeMap::new();
    a.stats().for_each(|k, v| {
        stats.insert(k.to_string(), v);
    });
    stats
}

/// The `stat KEY VALUE` lines of the program's output.
fn printed_stats(stdout: &str) -> BTreeMap<String, i64> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("stat "))
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').expect("stat KEY VALUE");
            (k.to_string(), v.parse().expect("a number"))
        })
        .collect()
}

/// Build abi_test.c into `dir`.
fn build_abi_test(dir: &Path) -> PathBuf {
    let exe = dir.join("abi_test");
    compile(&manifest_dir().join("tests/c/abi_test.c"), &exe, false);
    exe
}

/// `tests/c/ipc_test.c`, built in `dir`.
fn build_ipc_test(dir: &Path) -> PathBuf {
    let exe = dir.join("ipc_test");
    compile(&manifest_dir().join("tests/c/ipc_test.c"), &exe, false);
    exe
}

/// `LD_LIBRARY_PATH` with the stub `libcuda.so.1` first (`None`: the stubs
/// are built on Linux only).
fn cuda_stub_path() -> Option<std::ffi::OsString> {
    let mut path = cachealloc_tests::stub::StubKind::Cuda
        .dir()?
        .into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(old);
    }
    Some(path)
}

/// Check the output of abi_test: its statistics against the allocator's.
fn check_abi_output(out: &Output, side_stream: u64) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(stdout.contains("abi_test: all checks passed"), "{stdout}");
    let printed = printed_stats(&stdout);
    let expected = sequence_stats(side_stream);
    assert_eq!(printed.len(), expected.len(), "every memory_stats key");
    assert_eq!(
        printed, expected,
        "the C library's statistics are the allocator's"
    );
    assert_eq!(printed["num_ooms"], 1);
    assert!(printed["num_device_alloc"] >= 2);
    stdout
}

/// Through the C library: the verdict on a 20 MiB request
/// that only small-pool blocks could have held is the same whichever
/// stream holds them (and neither `other_streams` nor `mixed`), and a later
/// too-large request does not report it.
#[test]
fn the_verdict_does_not_depend_on_the_stream_of_small_blocks() {
    simulated_program_passes("oom_verdict_test", &[("CACHEALLOC_MOCK_CAPACITY", "64MiB")]);
}

/// Through the C library: a trace tracker, a segment source and a stream
/// filter that call `cachealloc_alloc` from inside (under their device's
/// lock) get an error naming the rule, the outer calls return, and the
/// devices stay usable; a hang fails the test (an alarm in the program).
#[test]
fn callbacks_that_call_back_in_get_an_error_not_a_hang() {
    simulated_program_passes("reentry_test", &[]);
}

/// Through the C library: the first call on a device from a thread with a
/// 64 KiB stack opens it (its allocator is built on a thread with room).
#[test]
fn a_device_opens_from_a_thread_with_a_small_stack() {
    simulated_program_passes("small_stack_test", &[]);
}

/// `tests/c/NAME.c`, built and run on the simulated device with `env`: it
/// ends with "NAME: all checks passed".
fn simulated_program_passes(name: &str, env: &[(&str, &str)]) {
    let dir = scratch(name);
    let exe = dir.join(name);
    compile(
        &manifest_dir().join(format!("tests/c/{name}.c")),
        &exe,
        false,
    );
    let mut cmd = program(&exe, "mock");
    cmd.envs(env.iter().copied());
    let out = run(&mut cmd, name);
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    assert!(
        stdout.contains(&format!("{name}: all checks passed")),
        "{stdout}"
    );
}

#[test]
fn c_abi_on_the_simulated_device() {
    let dir = scratch("mock");
    let exe = build_abi_test(&dir);
    let out = run(
        program(&exe, "mock")
            .env("CACHEALLOC_MOCK_CAPACITY", "1GiB")
            .args(["mock", "100000"])
            .arg(&dir),
        "abi_test on the simulated device",
    );
    let stdout = check_abi_output(&out, 0x10);
    print!("{stdout}");

    // The snapshots: the pool's segment, the history (cold start: every
    // segment's allocation is in it), the annotation.
    let json = std::fs::read_to_string(dir.join("snapshot.json")).expect("snapshot.json");
    let snap: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    let segments = snap["segments"].as_array().expect("segments");
    assert!(segments
        .iter()
        .any(|s| s["segment_pool_id"] == serde_json::json!([1, 0])));
    let trace = snap["device_traces"][0]
        .as_array()
        .expect("device 0's trace");
    let actions: Vec<&str> = trace.iter().filter_map(|e| e["action"].as_str()).collect();
    for a in [
        "alloc",
        "free_requested",
        "segment_alloc",
        "oom",
        "snapshot",
    ] {
        assert!(actions.contains(&a), "{a} in {actions:?}");
    }
    assert_eq!(
        snap["external_annotations"][0]["name"],
        "after the first allocations"
    );
    assert_eq!(snap["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"], "");
    let checker = manifest_dir().join("../tests/snapshot_check.py");
    match Command::new("python3").arg("--version").output() {
        Ok(o) if o.status.success() => {
            let out = run(
                Command::new("python3")
                    .arg(&checker)
                    .arg(dir.join("snapshot.pickle")),
                "snapshot_check.py",
            );
            print!("{}", String::from_utf8_lossy(&out.stdout));
        }
        _ => println!("no python3: the snapshot checker did not run"),
    }
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the stub drivers are built on Linux only"
)]
fn c_abi_on_the_cuda_stub() {
    let path = cuda_stub_path().expect("the stub drivers (built on Linux)");
    let dir = scratch("cuda");
    let exe = build_abi_test(&dir);
    let out = run(
        program(&exe, "cuda")
            .env("LD_LIBRARY_PATH", path)
            .args(["cuda", "100000"])
            .arg(&dir),
        "abi_test on the CUDA stub driver",
    );
    // The same sequence on the default stream only: the simulated device's
    // statistics with the side stream being stream 0.
    let stdout = check_abi_output(&out, 0);
    assert!(stdout.contains("ok stub driver: nothing held"), "{stdout}");
    print!("{stdout}");
}

#[test]
fn a_bad_setting_is_an_error_not_a_crash() {
    let dir = scratch("bad-setting");
    let src = dir.join("bad.c");
    std::fs::write(
        &src,
        r#"#include "cachealloc.h"
#include <stdio.h>
#include <string.h>
/* bad EXPECTED: the first alloc fails with EXPECTED in the message, and so
 * does every call that needs a device. */
int main(int argc, char **argv) {
    if (argc != 2) return 2;
    void *p = cachealloc_alloc(1000, 0, NULL);
    const char *e = cachealloc_last_error();
    if (p != NULL || e == NULL || !strstr(e, argv[1])) return 1;
    printf("%s\n", e);
    if (cachealloc_empty_cache(0) != -1 || !strstr(cachealloc_last_error(), argv[1])) return 1;
    return 0;
}
"#,
    )
    .expect("write");
    let exe = dir.join("bad");
    compile(&src, &exe, false);
    for (backend, var, conf, expected) in [
        ("mock", "CACHEALLOC_CONF", "bogus:1", "bogus"),
        (
            "mock",
            "CACHEALLOC_CONF",
            "max_split_size_mb:x",
            "max_split_size_mb",
        ),
        ("tpu", "CACHEALLOC_CONF", "", "CACHEALLOC_BACKEND"),
        // torch's newest variable, read when the others are unset; the
        // message names the key and the variable.
        (
            "mock",
            "PYTORCH_ALLOC_CONF",
            "throw_on_cudamalloc_oom:maybe",
            "throw_on_cudamalloc_oom",
        ),
        (
            "mock",
            "PYTORCH_ALLOC_CONF",
            "throw_on_cudamalloc_oom:maybe",
            "PYTORCH_ALLOC_CONF",
        ),
    ] {
        let out = run(
            program(&exe, backend).env(var, conf).arg(expected),
            &format!("CACHEALLOC_BACKEND={backend} {var}={conf}"),
        );
        print!("{}", String::from_utf8_lossy(&out.stdout));
    }
    // A torch 2.14 launch string there is taken.
    let ok = dir.join("ok.c");
    std::fs::write(
        &ok,
        r#"#include "cachealloc.h"
#include <stdio.h>
#include <string.h>
int main(void) {
    void *p = cachealloc_alloc(3 << 20, 0, NULL);
    if (p == NULL) { printf("%s\n", cachealloc_last_error()); return 1; }
    cachealloc_allocator_settings s;
    if (cachealloc_get_allocator_settings(&s) != 0) return 1;
    printf("settings: %s\n", s.last_allocator_settings);
    if (!strstr(s.last_allocator_settings, "large_segment_size_mb:12")) return 1;
    cachealloc_free(p, 0, 0, NULL);
    return 0;
}
"#,
    )
    .expect("write");
    let exe = dir.join("ok");
    compile(&ok, &exe, false);
    let conf = "expandable_segments:True,large_segment_size_mb:12,per_process_memory_fraction:0.4,\
                throw_on_cudamalloc_oom:True,pinned_max_cached_size_mb:64,graph_capture_record_stream_reuse:False";
    let out = run(
        program(&exe, "mock")
            .env("CACHEALLOC_MOCK_CAPACITY", "1GiB")
            .env("CACHEALLOC_TORCH_VERSION", "2.14.1")
            .env("PYTORCH_ALLOC_CONF", conf),
        "a torch 2.14 string in PYTORCH_ALLOC_CONF",
    );
    print!("{}", String::from_utf8_lossy(&out.stdout));
}

// -------------------------------------------------------------------- C++

/// In C++17 the callback types are `noexcept` function pointers: a lambda
/// that may throw does not convert to a trace tracker (or any other
/// callback), a `noexcept` one does, so no exception can be handed to the
/// library's frames by construction.
#[test]
fn cpp_refuses_a_callback_that_may_throw() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    if Command::new(&cxx).arg("--version").output().is_err() {
        println!("no C++ compiler ({cxx}) on this machine: skipped");
        return;
    }
    let dir = scratch("cpp_noexcept");
    let check = |name: &str, spec: &str| {
        let src = dir.join(format!("{name}.cpp"));
        let text = format!(
            "#include \"cachealloc.h\"\n#include <stdexcept>\n\
             int main() {{\n\
                 cachealloc_trace_tracker t = [](const cachealloc_trace_entry*, void*) {spec} {{\n\
                     throw std::runtime_error(\"from a tracker\");\n\
                 }};\n\
                 cachealloc_segment_source s{{}};\n\
                 s.release = [](void*) {spec} {{}};\n\
                 return cachealloc_attach_trace_tracker(t, nullptr) + (s.release != nullptr);\n\
             }}\n"
        );
        std::fs::write(&src, text).expect("write");
        Command::new(&cxx)
            .args(["-std=c++17", "-fsyntax-only", "-I"])
            .arg(manifest_dir().join("include"))
            .arg(&src)
            .output()
            .expect("run the C++ compiler")
    };
    let refused = check("throwing", "");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "a lambda that may throw compiled"
    );
    assert!(stderr.contains("noexcept"), "{stderr}");
    let taken = check("noexcept", "noexcept");
    assert!(
        taken.status.success(),
        "{}",
        String::from_utf8_lossy(&taken.stderr)
    );
}

#[test]
fn cpp_pool_hooks_through_std_function() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    if Command::new(&cxx).arg("--version").output().is_err() {
        println!("no C++ compiler ({cxx}) on this machine: skipped");
        return;
    }
    let dir = scratch("cpp");
    let src = dir.join("pool_hooks.cpp");
    std::fs::write(&src, CPP_POOL_HOOKS).expect("write");
    let exe = dir.join("pool_hooks");
    compile(&src, &exe, true);
    let out = run(&mut program(&exe, "mock"), "the C++ pool-hook test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("pool hooks: ok"), "{stdout}");
}

/// PyTorch's bindings (`_cuda_customAllocator`'s `set_*` setters) take a
/// hook's address as an integer, `reinterpret_cast` it to the hook's C++
/// type and keep it in a `std::function`.
const CPP_POOL_HOOKS: &str = r#"
#include "cachealloc.h"
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <utility>

typedef void *cudaStream_t;
typedef unsigned long long CaptureId_t;
typedef std::pair<CaptureId_t, CaptureId_t> MempoolId_t;

static bool error_has(const char *text) {
    const char *e = cachealloc_last_error();
    return e && std::strstr(e, text);
}

#define CHECK(c) do { if (!(c)) { std::printf("FAIL line %d: %s (%s)\n", __LINE__, #c, \
    cachealloc_last_error() ? cachealloc_last_error() : "no error"); return 1; } } while (0)

int main() {
    uintptr_t begin_addr = reinterpret_cast<uintptr_t>(&cachealloc_begin_allocate_to_pool);
    uintptr_t end_addr = reinterpret_cast<uintptr_t>(&cachealloc_end_allocate_to_pool);
    uintptr_t release_addr = reinterpret_cast<uintptr_t>(&cachealloc_release_pool);
    std::function<void(int, MempoolId_t, std::function<bool(cudaStream_t)>)> begin_fn =
        reinterpret_cast<void (*)(int, MempoolId_t, std::function<bool(cudaStream_t)>)>(begin_addr);
    std::function<void(int, MempoolId_t)> end_fn =
        reinterpret_cast<void (*)(int, MempoolId_t)>(end_addr);
    std::function<void(int, MempoolId_t)> release_fn =
        reinterpret_cast<void (*)(int, MempoolId_t)>(release_addr);

    MempoolId_t id{7, 3};
    begin_fn(0, id, [](cudaStream_t) { return true; });
    CHECK(cachealloc_last_error() == nullptr);
    // The hook received (0, 7, 3): the pool is routed to, so a second begin
    // with the same id from C is refused, naming it.
    cachealloc_begin_allocate_to_pool(0, 7, 3, nullptr);
    CHECK(error_has("already recording to mempool_id (7, 3)"));
    void *p = cachealloc_alloc(1000, 0, nullptr);
    CHECK(p != nullptr);
    end_fn(0, id);
    CHECK(cachealloc_last_error() == nullptr);
    // Ended: a second end from C is refused.
    cachealloc_end_allocate_to_pool(0, 7, 3);
    CHECK(error_has("not currently recording to mempool_id (7, 3)"));
    cachealloc_free(p, 1000, 0, nullptr);
    release_fn(0, id);
    CHECK(cachealloc_last_error() == nullptr);
    std::printf("pool hooks: ok\n");
    return 0;
}
"#;

// ----------------------------------------------------------------- README

/// The README's commands for examples/hello.c, run with the test's build
/// of the library (the README builds it with `--release`).
#[test]
fn readme_example() {
    let readme = std::fs::read_to_string(manifest_dir().join("../README.md")).expect("README");
    let doc = std::fs::read_to_string(manifest_dir().join("../docs/c-library.md")).expect("docs");
    for line in [
        "cargo build --release -p cachealloc-capi",
        r#"gcc -Icapi/include capi/examples/hello.c -L"${CARGO_TARGET_DIR:-target}/release" -lcachealloc -o hello"#,
        r#"CACHEALLOC_BACKEND=mock LD_LIBRARY_PATH="${CARGO_TARGET_DIR:-target}/release" ./hello"#,
    ] {
        assert!(
            readme.contains(line) && doc.contains(line),
            "the README's C quick start and docs/c-library.md have `{line}`"
        );
    }
    let source = manifest_dir().join("examples/hello.c");
    let text = std::fs::read_to_string(&source).expect("hello.c");
    assert!(
        doc.contains(&format!("```c\n{text}```")),
        "docs/c-library.md shows examples/hello.c as it is"
    );
    let dir = scratch("hello");
    let exe = dir.join("hello");
    compile(&source, &exe, false);
    let out = run(&mut program(&exe, "mock"), "examples/hello.c");
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    assert!(
        stdout.contains("allocated_bytes.all.current = 1048576"),
        "{stdout}"
    );
    assert!(
        stdout.contains("reserved_bytes.all.current = 0"),
        "{stdout}"
    );
}

#[test]
fn ipc_on_the_simulated_device() {
    let dir = scratch("ipc-mock");
    let exe = build_ipc_test(&dir);
    let out = run(
        program(&exe, "mock").arg("mock"),
        "ipc_test on the simulated device",
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("ipc_test: all checks passed"), "{stdout}");
    print!("{stdout}");
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the stub drivers are built on Linux only"
)]
fn ipc_between_two_processes_on_the_cuda_stub() {
    let path = cuda_stub_path().expect("the stub drivers (built on Linux)");
    let dir = scratch("ipc-cuda");
    let exe = build_ipc_test(&dir);
    let out = run(
        program(&exe, "cuda")
            .env("LD_LIBRARY_PATH", path)
            .env("CACHEALLOC_STUB_DEVICES", "2")
            .args(["cuda", "export"])
            .arg(dir.join("handle.bin")),
        "ipc_test on the CUDA stub driver",
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("ok consumer: opened"), "{stdout}");
    assert!(stdout.contains("ipc_test: all checks passed"), "{stdout}");
    print!("{stdout}");
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the stub drivers are built on Linux only"
)]
fn expandable_pages_between_two_processes_on_the_cuda_stub() {
    let path = cuda_stub_path().expect("the stub drivers (built on Linux)");
    let dir = scratch("ipc-pages-cuda");
    let exe = build_ipc_test(&dir);
    let out = run(
        program(&exe, "cuda")
            .env("LD_LIBRARY_PATH", path)
            .env("CACHEALLOC_CONF", "expandable_segments:True")
            .args(["cuda", "export-pages"])
            .arg(dir.join("pages.bin")),
        "ipc_test export-pages on the CUDA stub driver",
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("ok consumer: opened the pages"), "{stdout}");
    assert!(stdout.contains("ipc_test: all checks passed"), "{stdout}");
    print!("{stdout}");
}

/// `tests/c/graph_test.c`, built in `dir`.
fn build_graph_test(dir: &Path) -> PathBuf {
    let exe = dir.join("graph_test");
    compile(&manifest_dir().join("tests/c/graph_test.c"), &exe, false);
    exe
}

/// `LD_LIBRARY_PATH` with `kind`'s stub first.
fn stub_path(kind: cachealloc_tests::stub::StubKind) -> Option<std::ffi::OsString> {
    let mut path = kind.dir()?.into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(old);
    }
    Some(path)
}

/// Run graph_test on `backend` (`mock`, `cuda`, `hip`) under `conf`.
fn graph_test(backend: &str, conf: &str) -> String {
    let dir = scratch(&format!(
        "graph-{backend}-{}",
        conf.replace([':', ','], "-")
    ));
    let exe = build_graph_test(&dir);
    let mut cmd = program(&exe, backend);
    cmd.arg(backend)
        .env("CACHEALLOC_CONF", conf)
        .env("CACHEALLOC_MOCK_CAPACITY", "1GiB")
        .env("CACHEALLOC_STUB_DEVICES", "2");
    let kind = match backend {
        "cuda" => Some(cachealloc_tests::stub::StubKind::Cuda),
        "hip" => Some(cachealloc_tests::stub::StubKind::Hip),
        _ => None,
    };
    if let Some(kind) = kind {
        cmd.env(
            "LD_LIBRARY_PATH",
            stub_path(kind).expect("the stub drivers (Linux)"),
        );
    }
    let out = run(&mut cmd, &format!("graph_test {backend} {conf:?}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(stdout.contains("graph_test: all checks passed"), "{stdout}");
    print!("{stdout}");
    stdout
}

/// An out-of-memory observer that reads the statistics, records an
/// annotation and allocates on the failing device returns (no deadlock),
/// and a panic inside a device's lock fails that device only.
#[test]
fn observers_call_back_and_a_panic_fails_one_device() {
    let out = graph_test("mock", "");
    assert!(out.contains("ok an OOM observer that calls back into the same device returns"));
    if cfg!(feature = "debug-hooks") {
        assert!(out.contains("failed device 1 only"));
    } else {
        println!("(the panic inside a lock needs the test hooks: cargo test --workspace)");
    }
}

/// torch.cuda.graph's sequence through the C library on the CUDA stub
/// driver, which refuses what the real driver refuses during a capture:
/// the capture is never invalidated, with and without expandable segments.
#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the stub drivers are built on Linux only"
)]
fn graph_capture_through_the_c_library_on_the_cuda_stub() {
    for conf in ["", "expandable_segments:True"] {
        let out = graph_test("cuda", conf);
        assert!(out.contains("never invalidated"), "{out}");
    }
}

/// The same on the HIP stub runtime (the library built with `hip`).
#[cfg(feature = "hip")]
#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the stub drivers are built on Linux only"
)]
fn graph_capture_through_the_c_library_on_the_hip_stub() {
    for conf in ["", "expandable_segments:True"] {
        let out = graph_test("hip", conf);
        assert!(out.contains("never invalidated"), "{out}");
    }
}

/// The C functions the C++ allocator for torch is built on
/// (tests/c/native_test.c): the statistics struct, the error code of an
/// out-of-memory, the snapshot walk, the stream filter of a pool, trace
/// trackers and the settings.
#[test]
fn the_native_layers_functions_on_the_simulated_device() {
    let dir = scratch("native");
    let exe = dir.join("native_test");
    compile(&manifest_dir().join("tests/c/native_test.c"), &exe, false);
    let mut cmd = program(&exe, "mock");
    cmd.env(
        "CACHEALLOC_CONF",
        "max_split_size_mb:64,roundup_power2_divisions:4",
    )
    .env("CACHEALLOC_MOCK_CAPACITY", "1GiB");
    let out = run(&mut cmd, "native_test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    assert!(
        stdout.contains("native_test: all checks passed"),
        "{stdout}"
    );
}

#[cfg(unix)]
/// torch's pluggable path never gets a NULL for a failed allocation:
/// `cachealloc_pluggable_alloc` prints PyTorch's message and aborts.
#[test]
fn the_pluggable_alloc_aborts_on_out_of_memory() {
    use std::os::unix::process::ExitStatusExt;
    let dir = scratch("pluggable-oom");
    let exe = dir.join("native_test");
    compile(&manifest_dir().join("tests/c/native_test.c"), &exe, false);
    let out = program(&exe, "mock")
        .arg("pluggable-oom")
        .env("CACHEALLOC_MOCK_CAPACITY", "1GiB")
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.contains("before the out-of-memory"),
        "{stdout}{stderr}"
    );
    assert!(!stdout.contains("not reached"), "{stdout}");
    assert_eq!(out.status.signal(), Some(6), "SIGABRT: {stderr}");
    assert!(
        stderr.contains("CUDA out of memory. Tried to allocate 2.00 GiB")
            && stderr.contains("cannot raise torch.OutOfMemoryError"),
        "{stderr}"
    );
}
