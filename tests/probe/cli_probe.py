#!/usr/bin/env python3
"""Hostile-input probe for the switchboard CLI (Python 3 standard library only).

Drives `switchboard export|run|inspect` with mutated config.json and model.safetensors files,
odd prompts/token counts/devices, damaged exports, awkward OUT paths and concurrent exports,
and checks: no crash (signal, exit >= 128, sanitizer text), no hang (--timeout), no half-written
or mismatched output (a failed export leaves OUT as it was and no OUT.partial-*; a successful
one passes `inspect --verify`), damaged weights caught by `inspect --verify`, and errors that
are one line (< 400 chars) naming the file or option at fault.

    python3 tests/probe/cli_probe.py --scale ci      # ~5% of each big class, < 2 min on 2 cores
    python3 tests/probe/cli_probe.py --scale full    # every case (~9,200 inputs, ~3 min on 2 cores)

Prints per-class counts, failing cases (up to 20 per class) and one final JSON line. Exit
status 1 if any crash, hang or bad output (unclear messages are reported, not fatal).
"""
import argparse, concurrent.futures, copy, hashlib, json, os, pathlib, random, re, resource, shlex, shutil
import stat, struct, subprocess, sys, tempfile, threading, time, traceback

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAMILIES = ["glm4_moe", "gpt_oss", "mixtral", "olmoe", "qwen2_moe", "qwen3_moe", "qwen3_moe_geglu"]
CRASH_MARKERS = ("AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer", "ThreadSanitizer",
                 "runtime error:", "terminate called", "Aborted", "stack smashing")
COUNT_KEYS = ("inputs", "ok", "error", "usage_error", "crashes", "hangs", "bad_outputs",
              "unclear_messages", "corruption_found_by_verify")
TOKENS_RE = re.compile(r"Generated token ids: \[([0-9, ]*)\]")
TINY_VOCAB = 256  # --tiny-test: vocab 256, max_seq 512
MODEL_FILES = ("program.sbp", "weights.safetensors")
BIN, TIMEOUT = None, 60.0  # set by main()

# ---------------------------------------------------------------- running one command
class Res:
    def __init__(self, argv, rc, out, err, hung):
        self.argv, self.rc, self.hung = argv, rc, hung
        self.out, self.err = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    @property
    def cmd(self):  # shell-pasteable, with giant arguments elided so reports stay readable
        return shlex.join(a if len(a) <= 160 else f"<{len(a)} chars: {a[:40]}...>" for a in [BIN] + self.argv)


def sb(argv, cwd=None):
    for _ in range(20):  # the binary (or its .so) being relinked by a build is not a CLI failure: wait, retry
        try:
            p = subprocess.run([BIN] + argv, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, timeout=TIMEOUT)
        except subprocess.TimeoutExpired as e:  # run() has already killed the child
            return Res(argv, None, e.stdout or b"", e.stderr or b"", True)
        except OSError:  # missing or half-written executable
            p = None
        if p and not (p.returncode == 127 and b"error while loading shared libraries" in p.stderr):
            return Res(argv, p.returncode, p.stdout, p.stderr, False)
        time.sleep(30)
    sys.exit(f"cli_probe: {BIN} does not start (being rebuilt?)")


def classify(r):
    if r.hung:
        return "hang"
    if r.rc < 0 or r.rc >= 128 or any(m in r.err for m in CRASH_MARKERS):
        return "crash"
    return {0: "ok", 1: "error"}.get(r.rc, "usage_error")  # CLI11 usage errors: small codes (105, 106, 109)


def error_lines(err):
    """stderr minus the export progress bar and device fallback warnings: what is left is the error."""
    return [l for l in err.splitlines()
            if l.strip() and not l.startswith("converting [") and not l.startswith("[switchboard warning]")]

# ---------------------------------------------------------------- one case and its verdict
class Case:
    """One input. Its primary invocation decides ok/error/usage_error; any invocation can make
    it a crash or hang; checks add bad outputs, unclear messages and notes (info, not failures)."""

    def __init__(self, label, dir):
        self.label, self.dir, self.kind = label, dir, None
        self.crash = self.hang = self.unclear = self.verify_found = False
        self.bad, self.events, self.info = [], [], []

    def run(self, argv, primary=True, cwd=None, r=None):  # r: judge a result obtained elsewhere
        r = r or sb(argv, cwd)
        k = classify(r)
        if k in ("crash", "hang"):
            setattr(self, k, True)
            self.events.append((k if r.hung else f"crash (exit {r.rc})", r))
        if primary:
            self.kind = k
        return r

    def bad_output(self, why, r=None):
        self.bad.append(why)
        self.events.append((f"bad output: {why}", r))

    def note(self, key, why=None, r=None):
        self.info.append(key)
        if why:
            self.events.append((f"note: {why}", r))

    def expect_clear(self, r, names):
        """An exit-1 error must be one line, < 400 chars, naming the file/option (any of names)."""
        if r.hung or r.rc != 1:
            return
        lines = error_lines(r.err)
        if len(lines) == 1 and len(lines[0]) < 400 and any(n in lines[0] for n in names):
            return
        self.unclear = True
        what = (f"{len(lines)} lines" if len(lines) != 1 else f"{len(lines[0])} chars" if len(lines[0]) >= 400
                else "names none of " + ", ".join(map(repr, names)))
        self.events.append((f"unclear message ({what})", r))

    def failed(self):
        return bool(self.crash or self.hang or self.bad or self.unclear)

# ---------------------------------------------------------------- file-system helpers
def write(path, data):
    pathlib.Path(path).write_bytes(data if isinstance(data, bytes) else data.encode())


def sha(path):
    return hashlib.sha1(pathlib.Path(path).read_bytes()).hexdigest()


def snapshot(path):
    """What is at path (recursively): enough to tell whether a failed export touched it."""
    if not os.path.lexists(path):
        return None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return ("link", os.readlink(path))
    if stat.S_ISDIR(st.st_mode):
        return ("dir", stat.S_IMODE(st.st_mode), {n: snapshot(os.path.join(path, n)) for n in sorted(os.listdir(path))})
    if stat.S_ISREG(st.st_mode):  # the inode too: a failed export must not even replace a file with a copy
        return ("file", st.st_ino, st.st_size, sha(path))
    return ("other", stat.S_IFMT(st.st_mode))


def staging_names(root):
    """Every staging directory or temp file under root (OUT.partial-*, *.tmp)."""
    return {os.path.relpath(os.path.join(d, n), root) for d, dirs, files in os.walk(root)
            for n in dirs + files if ".partial-" in n or n.endswith(".tmp")}


def rmtree(path):
    for d, dirs, _ in os.walk(path):  # undo the placement cases' chmod 0555 first
        for n in dirs:
            if not os.path.islink(os.path.join(d, n)):
                os.chmod(os.path.join(d, n), 0o755)
    shutil.rmtree(path, ignore_errors=True)


SPECIAL = {  # what a path can be instead of a regular file
    "fifo": os.mkfifo,
    "directory": lambda p: (os.mkdir(p), write(os.path.join(p, "x"), b"x")),
    "symlink-/dev/zero": lambda p: os.symlink("/dev/zero", p),
    "symlink-/dev/urandom": lambda p: os.symlink("/dev/urandom", p),
    "dangling-symlink": lambda p: os.symlink(p + ".nowhere", p),
    "symlink-loop": lambda p: os.symlink(os.path.basename(p), p),
}


def place(path, content):
    """content: bytes, a SPECIAL's name, or a zero-argument callable making the bytes (lazily:
    thousands of mutated 400 KB files are never held at once)."""
    if isinstance(content, str):
        SPECIAL[content](path)
    else:
        write(path, content() if callable(content) else content)


def flip(b, pos, mask):
    return b[:pos] + bytes([b[pos] ^ mask]) + b[pos + 1:]

# ---------------------------------------------------------------- export checks
def verify(case, target):
    r = case.run(["inspect", "--verify", target], primary=False)
    if not r.hung and (r.rc != 0 or "verified:" not in r.out + r.err):
        case.bad_output(f"export exited 0 but `inspect --verify {target}` fails", r)
    return r


def checked_export(case, argv, out, names, cwd=None, expect=None):
    """Runs an export and checks atomicity: exit 0 -> both files, verified, nothing stray;
    otherwise OUT exactly as before; never a staging dir left behind; a clear error line."""
    out_path = os.path.join(cwd or "", out)
    before_stage, before = staging_names(case.dir), snapshot(out_path)
    r = case.run(["export"] + argv + ["--out", out], cwd=cwd)
    if case.crash or case.hang:
        return r  # a killed process cannot clean up; the crash/hang is the finding
    if staging_names(case.dir) - before_stage:
        case.bad_output(f"left behind {sorted(staging_names(case.dir) - before_stage)}", r)
    if r.rc == 0:
        if expect == "error":
            case.bad_output("export succeeded where it must fail", r)
        if not all(os.path.isfile(os.path.join(out_path, f)) for f in MODEL_FILES):
            case.bad_output("export exited 0 without both model files in OUT", r)
            return r
        verify(case, out_path)
        existing = before
        if before and before[0] == "link" and os.path.isdir(out_path):  # OUT a symlink: the target's files
            existing = snapshot(os.path.realpath(out_path))
        stray = set(os.listdir(out_path)) - set(MODEL_FILES) - set(existing[2] if existing and existing[0] == "dir" else ())
        if stray:
            case.bad_output(f"stray files in OUT: {sorted(stray)}", r)
    else:
        if snapshot(out_path) != before:
            case.bad_output("failed export changed OUT", r)
        if expect == "ok":
            case.bad_output("export failed where it should succeed", r)
        case.expect_clear(r, names)
    return r


def hf_case(case, fx, fam, mutated, content, flags, other=None):
    """A copy of fixture `fam` with one file replaced by content (other: a callable(hf_dir)
    adding something beside the good files instead), exported with flags."""
    hf = os.path.join(case.dir, "hf")
    os.mkdir(hf)
    for f in ("config.json", "model.safetensors"):
        if f != mutated or other:
            os.link(os.path.join(fx, fam, f), os.path.join(hf, f))
    if other:
        other(hf)
    else:
        place(os.path.join(hf, mutated), content)
    # A quantizing export may be refused for the flag itself ("--group-size 32 does not divide
    # the input width 48": qwen2_moe has no allowed group size); naming the flag is clear.
    r = checked_export(case, ["--hf", hf] + flags, os.path.join(case.dir, "out"), [mutated, hf] + flags[::2])
    if r.rc == 0 and "bit flip" in case.label:
        case.note("bit flip exported")


def with_flags(fx, mutated, fam, muts, start, gs):
    """Cases for muts, alternating the float and the quantizing export paths."""
    out = []
    for i, (label, content) in enumerate(muts, start):
        flags = ["--bits", "4", "--group-size", str(gs)] if i % 2 else []
        other = content[1] if isinstance(content, tuple) else None
        out.append((f"{fam}: {label}" + (" [quantized]" if flags else ""), lambda c, m=content, f=flags, o=other:
                    hf_case(c, fx, fam, mutated, m, f, o)))
    return out

# ---------------------------------------------------------------- class 1: config.json
CONFIG_VALUES = [("null", "null"), ("true", "true"), ("false", "false"), ("-1", "-1"), ("0", "0"), ("1", "1"),
                 ("3", "3"), ("2**31", str(2**31)), ("2**63", str(2**63)), ("-2**63", str(-2**63)),
                 ("1e308", "1e308"), ("-1e308", "-1e308"), ("0.5", "0.5"), ('"x"', '"x"'), ('""', '""'),
                 ("[]", "[]"), ("{}", "{}"), ("[1,2]", "[1, 2]"),
                 ("list-nested-100000", lambda: "[" * 100000 + "]" * 100000),
                 ("string-10MB", lambda: '"' + "x" * (10 << 20) + '"')]
# Keys the fixtures lack but real checkpoints carry: mutated inside a few families' configs.
INJECTED = {"quantization": {"group_size": 32, "bits": 4},
            "rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128}}
INJECT_INTO = ("mixtral", "olmoe", "qwen3_moe")


def key_paths(o, p=()):
    for k, v in (o.items() if isinstance(o, dict) else enumerate(o) if isinstance(o, list) else ()):
        yield p + (k,)
        yield from key_paths(v, p + (k,))


def mutated_config(cfg, path, raw):
    c = copy.deepcopy(cfg)
    parent = c
    for k in path[:-1]:
        parent = parent[k]
    if raw is None:
        del parent[path[-1]]
        return json.dumps(c, indent=2).encode()
    parent[path[-1]] = "@@probe@@"  # spliced in as text: json.dumps cannot write 100000-deep nesting
    return json.dumps(c, indent=2).replace('"@@probe@@"', raw() if callable(raw) else raw).encode()


def config_damage(text, rnd):
    """Whole-file damage to one config.json."""
    L, mt, hs = len(text), b'"model_type": "', b'"hidden_size": 64'
    out = [("empty", b"")] + [(f"truncated@{n}", text[:n]) for n in sorted({1, 2, 10, L // 4, L // 2, L - 2, L - 1})]
    return out + [
        ("random-16", rnd.randbytes(16)), ("random-1000", rnd.randbytes(1000)), (f"random-{L}", rnd.randbytes(L)),
        ("invalid-utf8", text.replace(mt, mt + b"\xff\xfe", 1)), ("overlong-utf8", text.replace(mt, mt + b"\xc0\xaf", 1)),
        ("lone-surrogate", text.replace(mt, mt + b"\xed\xa0\x80", 1)),
        ("nul-byte", text[:L // 2] + b"\x00" + text[L // 2:]), ("utf8-bom", b"\xef\xbb\xbf" + text),
        ("utf16", text.decode().encode("utf-16")), ("top-level-array", b"[" + text + b"]"),
        ("top-level-number", b"42"), ("top-level-string", b'"config"'), ("top-level-null", b"null"),
        ("duplicate-keys", b'{"hidden_size": 7, "model_type": "nonsense", ' + text.lstrip()[1:]),
        ("trailing-garbage", text + b"}}garbage"), ("two-objects", text + text),
        ("comment", b"// a comment\n" + text), ("trailing-comma", text.rstrip()[:-1].rstrip() + b",\n}"),
        ("NaN", text.replace(hs, b'"hidden_size": NaN')), ("Infinity", text.replace(hs, b'"hidden_size": Infinity')),
        ("5000-digit-number", text.replace(hs, b'"hidden_size": 1' + b"0" * 5000)),
        ("object-nested-100000", b'{"a":' * 100000 + b"1" + b"}" * 100000),
        ("unterminated-string", b'{"model_type": "olm')] + [(n, n) for n in SPECIAL]


def config_cases(fx, rnd, gs):
    cases = []
    for fam in FAMILIES:
        text = open(os.path.join(fx, fam, "config.json"), "rb").read()
        base = json.loads(text)
        targets = [(base, p) for p in key_paths(base)]
        if fam in INJECT_INTO:
            inj = dict(base, **INJECTED)
            targets += [(inj, p) for p in key_paths(inj) if p[0] in INJECTED]
        muts = [(".".join(map(str, p)) + f" = {vn}", lambda c=cfg, p=p, raw=raw: mutated_config(c, p, raw))
                for cfg, p in targets for vn, raw in [("<deleted>", None)] + CONFIG_VALUES]
        muts += [(f"file: {n}", content) for n, content in config_damage(text, rnd)]
        cases += with_flags(fx, "config.json", fam, muts, len(cases), gs)
    return cases

# ---------------------------------------------------------------- class 2: model.safetensors
def st_join(header, data):
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def tensor_edits(h, name, data_len):
    """Header edits of one tensor's entry: dtype, shape, data_offsets, the entry gone."""
    e = h[name]
    a, b = e["data_offsets"]
    sh, rank = e["shape"], len(e["shape"])
    prev_end = max([v["data_offsets"][1] for k, v in h.items() if k != "__metadata__" and v["data_offsets"][1] <= a],
                   default=None)
    edits = [("dtype", d) for d in ("XX", "", 5, None, "F32", "F16", "I8", "F64", "BOOL", "U8", "F8_E4M3", "bf16")]
    edits += [("shape", s) for s in ([-1] + sh[1:], [2**62] * rank, [2**31, 2**31], [], [(b - a) // 2], sh + [1],
                                     [1] + sh, ["a"] * rank, [1.5] + sh[1:], None, [0] * rank, [2**64] * rank,
                                     [2**32 + x for x in sh])]
    overlap = [prev_end - 2, prev_end - 2 + b - a] if prev_end else [a + 2, b + 2]
    edits += [("data_offsets", o) for o in ([b, a], overlap, [a, b + 2], [a, data_len * 2], [data_len, data_len + b - a],
                                            [a, 2**64 - 1], [a + 0.5, b + 0.5], [str(a), str(b)], [a], [a, b, b],
                                            [-1, b - a - 1], [2**63, 2**63 + b - a], None)]
    out = []
    for field, value in edits + [(None, None)]:
        h2 = copy.deepcopy(h)
        if field is None:
            del h2[name]
        elif value is None:
            del h2[name][field]
        else:
            h2[name][field] = value
        out.append((f"{name}: " + (f"{field}={value}" if field else "missing"), h2))
    return out


def st_mutations(b, rnd):
    n = struct.unpack("<Q", b[:8])[0]
    h, data, size, hend = json.loads(b[8:8 + n]), b[8 + n:], len(b), 8 + n
    names = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
    lens = set(range(9)) | {9 + n * i // 30 for i in range(30)} | {hend - 1, hend, hend + 1, size - 1}
    lens |= {hend + (size - hend) * i // 30 for i in range(1, 30)}
    muts = [(f"truncated@{L}", lambda L=L: b[:L]) for L in sorted(lens)]
    for where, lo, hi, count in (("header", 0, hend, 60), ("data", hend, size, 30)):
        for pos, bit in [(rnd.randrange(lo, hi), rnd.randrange(8)) for _ in range(count)]:
            muts.append((f"{where} bit flip @{pos}.{bit}", lambda pos=pos, bit=bit: flip(b, pos, 1 << bit)))
    muts += [(f"header length = {v}", lambda v=v: struct.pack("<Q", v) + b[8:])
             for v in (0, 7, n - 1, n + 1, size - 8, size - 8 + 1, 2**32, 2**40, 2**63, 2**64 - 1)]
    for name in (names[0], names[len(names) // 2], names[-1]):
        muts += [(label, lambda h2=h2: st_join(h2, data)) for label, h2 in tensor_edits(h, name, len(data))]
    raw, first = json.dumps(h), h[names[0]]
    plus = lambda **kv: st_join(dict(h, **kv), data)
    meta = lambda m: st_join(dict({"__metadata__": m}, **{k: v for k, v in h.items() if k != "__metadata__"}), data)
    extra = {"dtype": "BF16", "shape": [8], "data_offsets": [len(data), len(data) + 16]}
    dup = raw[:-1] + f', {json.dumps(names[0])}: {json.dumps(dict(first, data_offsets=[0, 2]))}}}'
    muts += [("extra unused tensor aliasing data", lambda: plus(**{"zzz.unused": first})),
             ("extra unused tensor with its own data", lambda: st_join(dict(h, **{"zzz.extra": extra}), data + bytes(16))),
             ("extra tensor past the end", lambda: plus(**{"zzz.past": dict(first, data_offsets=[size, size + 2])})),
             ("extra tensor named ../../etc/passwd", lambda: plus(**{"../../etc/passwd": first})),
             ("duplicate tensor key", lambda: st_join(dup.encode(), data)),
             ("duplicate __metadata__", lambda: st_join((raw[:-1] + ', "__metadata__": {"format": "np"}}').encode(), data)),
             ("shape nested 100000 deep",
              lambda: st_join(raw.replace(json.dumps(first["shape"]), "[" * 100000 + "]" * 100000, 1).encode(), data)),
             ("header nested 100000 deep", lambda: st_join(b'{"a":' * 100000 + b"1" + b"}" * 100000, data)),
             ("header = []", lambda: st_join(b"[]", data)), ('header = ""', lambda: st_join(b'""', data)),
             ("header = {}", lambda: st_join(b"{}", data)), ("header = 5", lambda: st_join(b"5", data)),
             ("header NUL padding", lambda: struct.pack("<Q", n + 8) + b[8:hend] + bytes(8) + data),
             ("header trailing garbage", lambda: st_join(raw.encode() + b"}garbage", data)),
             ("header invalid UTF-8", lambda: st_join(raw.replace('"pt"', '"p\\u0000t"').encode().replace(b"\\u0000", b"\xff"), data)),
             ("header 10MB metadata value", lambda: meta({"format": "pt", "pad": "x" * (10 << 20)})),
             ("data appended", lambda: b + bytes(64))]
    muts += [(f"__metadata__ = {json.dumps(m)}", lambda m=m: meta(m)) for m in (
        {"format": 1}, {"format": None}, {"format": {"a": "b"}}, {"format": ["pt"]}, {"format": True}, "pt", [], None, 5)]
    return muts + [(name, name) for name in SPECIAL]


def st_cases(fx, rnd, gs):
    cases = []
    for fam in FAMILIES:
        b = open(os.path.join(fx, fam, "model.safetensors"), "rb").read()
        junk, shard = rnd.randbytes(100), lambda data: lambda hf: write(os.path.join(hf, "model-2.safetensors"), data)
        index = json.dumps({"weight_map": {"lm_head.weight": "gone.safetensors"}})
        muts = st_mutations(b, rnd) + [  # beside the good file: more *.safetensors, an index naming a missing shard
            ("second shard duplicating every tensor", ("dir", shard(b))),
            ("second shard of random bytes", ("dir", shard(junk))),
            ("index naming a missing shard", ("dir", lambda hf: write(os.path.join(hf, "model.safetensors.index.json"), index)))]
        cases += with_flags(fx, "model.safetensors", fam, muts, len(cases), gs)
    return cases

# ---------------------------------------------------------------- class 3: run inputs
def run_cases(work, rnd):
    """One good tiny model M, a second export M2 of the same model, M's CPU baseline tokens;
    then prompts, token counts, devices, and damaged copies of M."""
    ctx = {"M": os.path.join(work, "models", "M"), "M2": os.path.join(work, "models", "M2")}
    os.makedirs(os.path.join(work, "models"))
    for m in ("M", "M2"):
        r = sb(["export", "--tiny-test", "--bits", "4", "--out", ctx[m]])
        if r.rc != 0:
            sys.exit(f"cli_probe: cannot export the tiny model: {r.cmd}: {r.err.strip()}")
    r = sb(["run", "--program", ctx["M"], "--prompt-ids", "1,2,3", "--max-new-tokens", "4", "--device", "cpu"])
    if r.rc != 0 or not TOKENS_RE.search(r.out):
        sys.exit(f"cli_probe: the good tiny model does not run: {r.cmd}: {r.err.strip()}")
    ctx["baseline"] = [int(x) for x in TOKENS_RE.search(r.out).group(1).split(",")]
    M, M2, cases = ctx["M"], ctx["M2"], []
    prog, weights = os.path.join(M, "program.sbp"), os.path.join(M, "weights.safetensors")
    P, W = open(prog, "rb").read(), open(weights, "rb").read()
    wn = struct.unpack("<Q", W[:8])[0] + 8  # first data byte of the weights
    add = lambda label, fn: cases.append((label, fn))
    ids = lambda k: ",".join(str(i % TINY_VOCAB) for i in range(k))
    # expectations: 512 ids + 1 new token fits max_seq 512 (the last token needs no KV slot)
    for s, expect in [("", "error"), ("-1", "error"), ("256", "error"), ("255", "ok"), ("0", "ok"), ("1,2,3", "ok"),
                      ("2147483648", "error"), ("4294967297", "error"), ("-2147483649", "error"), ("9" * 40, "error"),
                      ("1,,2", "error"), (",1", "error"), ("1,", "any"), (",", "error"), ("a", "error"), ("1a", "error"),
                      ("0x10", "error"), ("1e2", "error"), ("1.0", "error"), (" 1", "any"), ("1 ", "any"),
                      ("1, 2", "any"), ("+1", "any"), ("1;2", "error"), ("1\n2", "error"), ("\t1", "any"),
                      ("\u0661", "error"), ("\uff11", "error"), ("\u0661,\u0662", "error"), ("\u00b2", "error"),
                      ("1\udcff", "error"), (ids(600), "error"), (ids(511), "ok"), (ids(512), "any"), (ids(513), "error"),
                      (ids(100000)[:120000], "error"), ("1," * 59999 + "1", "error"), ("0" * 100000 + "1", "any"),
                      ("-0", "any"), ("00000000000000000001", "any")]:
        add(f"prompt-ids {s[:30]!r}" + (f" ({len(s)} chars)" if len(s) > 30 else ""), lambda c, s=s, e=expect: run_model(
            c, M, ["--prompt-ids", s, "--max-new-tokens", "1"], e, 1, ["--prompt-ids", "max_seq", "vocabulary"]))
    for n, expect in [("0", "usage"), ("1", "ok"), ("511", "ok"), ("512", "any"), ("600", "error"),
                      (str(2**31), "usage"), ("-1", "usage"), ("abc", "usage"), ("", "usage"), ("1e3", "usage")]:
        add(f"max-new-tokens {n!r}", lambda c, n=n, e=expect: run_model(
            c, M, ["--prompt-ids", "1", "--max-new-tokens", n], e, int(n) if n.isdigit() else None,
            ["--max-new-tokens", "max_seq"]))
    for dev in ("cpu", "vulkan", "vulkan:0", "vulkan:1", "vulkan:99", "vulkan:-1", "vulkan:", "vulkan:abc",
                "vulkan:99999999999999999999", "metal", "", "cpu:1", "CPU", "gpu", "garbage", "cpu,vulkan",
                "\udcff", "x" * 10000):  # any device that runs (or falls back to the CPU) must give the CPU's tokens
        add(f"device {dev[:30]!r}", lambda c, d=dev: run_model(
            c, M, ["--prompt-ids", "1,2,3", "--max-new-tokens", "4", "--device", d], "any", 4,
            ["--device", "device"], ctx["baseline"]))
    for L in sorted(set(range(73)) | {73 + (len(P) - 73) * i // 60 for i in range(60)} | {len(P) - 1}):
        add(f"program.sbp truncated@{L}", lambda c, L=L: damaged(c, ctx, lambda: P[:L], None, "prog-trunc"))
    # every header byte once, then random bytes of the FlatBuffer
    for pos, bit in [(p, rnd.randrange(8)) for p in range(64)] + [(rnd.randrange(64, len(P)), rnd.randrange(8))
                                                                  for _ in range(336)]:
        add(f"program.sbp bit flip @{pos}.{bit}",
            lambda c, pos=pos, bit=bit: damaged(c, ctx, lambda: flip(P, pos, 1 << bit), None, "prog-flip"))
    for where, lo, hi, count in (("data", wn, len(W), 150), ("header", 0, wn, 40)):
        for pos, val in [(rnd.randrange(lo, hi), rnd.randrange(1, 256)) for _ in range(count)]:
            add(f"weights {where} byte @{pos} ^= {val:#x}",
                lambda c, pos=pos, val=val, w=where: damaged(c, ctx, None, lambda: flip(W, pos, val), "w-" + w))
    for L in sorted({0, 4, 8, 9, wn // 2, wn - 1, wn, wn + 1, len(W) - 1} | {wn + (len(W) - wn) * i // 32 for i in range(1, 32)}):
        add(f"weights truncated@{L}", lambda c, L=L: damaged(c, ctx, None, lambda: W[:L], "w-trunc"))
    add("weights extended by 1 byte", lambda c: damaged(c, ctx, None, W + b"\0", "w-trunc"))
    other = lambda f: lambda: open(os.path.join(M2, f), "rb").read()
    add("weights of a second export", lambda c: damaged(c, ctx, None, other("weights.safetensors"), "swap"))
    add("program of a second export", lambda c: damaged(c, ctx, other("program.sbp"), None, "swap"))
    add("inspect --verify --weights of a second export", lambda c: swap_verify(c, M, M2))
    for name in list(SPECIAL) + ["missing"]:
        add(f"program.sbp is {name}", lambda c, n=name: damaged(c, ctx, n, None, "special"))
        add(f"weights.safetensors is {name}", lambda c, n=name: damaged(c, ctx, None, n, "special"))
    for label, target, expect in [("the program file itself", prog, "ok"), ("/dev/zero", "/dev/zero", "error"),
                                  ("the weights file", weights, "error"), ("a missing path", M + ".nowhere", "error"),
                                  ("the model dir with a trailing slash", M + "/", "ok"), ("/", "/", "error"),
                                  ("an empty string", "", "any")]:
        add(f"--program {label}", lambda c, t=target, e=expect: run_model(
            c, t, ["--prompt-ids", "1,2,3", "--max-new-tokens", "4"], e, 4, [t or "--program", "program"]))
    return cases


def tokens_of(case, r, n, baseline=None):
    """A successful run must print exactly n in-vocabulary tokens (the baseline's, if given)."""
    m = TOKENS_RE.search(r.out)
    if not m:
        return case.bad_output("exit 0 without a token list", r)
    toks = [int(x) for x in m.group(1).split(",") if x.strip()]
    if n is not None and len(toks) != n or any(not 0 <= t < TINY_VOCAB for t in toks):
        case.bad_output(f"asked for {n} tokens, got {toks[:20]}", r)
    elif baseline is not None and toks != baseline:
        case.bad_output(f"tokens {toks} differ from the CPU baseline {baseline}", r)
    return toks


def run_model(case, program, argv, expect, n, names, baseline=None):
    r = case.run(["run", "--program", program] + argv)
    if r.hung or case.crash:
        return
    if r.rc == 0:
        tokens_of(case, r, n, baseline)
    case.expect_clear(r, names)
    got = {0: "ok", 1: "error"}.get(r.rc, "usage")
    if expect in ("ok", "error") and got != expect or expect == "usage" and got == "ok":
        case.bad_output(f"expected {expect}, got {got} (exit {r.rc})", r)


def damaged(case, ctx, prog, weights, kind):
    """A copy of M with program.sbp and/or weights.safetensors replaced (None: a hard link to M's)."""
    d = os.path.join(case.dir, "m")
    os.mkdir(d)
    for name, content in (("program.sbp", prog), ("weights.safetensors", weights)):
        if content is None:
            os.link(os.path.join(ctx["M"], name), os.path.join(d, name))
        elif content != "missing":
            place(os.path.join(d, name), content)
    r = case.run(["run", "--program", d, "--prompt-ids", "1,2,3", "--max-new-tokens", "4"])
    if r.hung or case.crash:
        return
    case.expect_clear(r, [d])
    if kind == "prog-flip":  # refused or run cleanly are both fine; count what catches what
        case.run(["inspect", os.path.join(d, "program.sbp")], primary=False)  # the listing reads more of the file
        if r.rc == 0 and tokens_of(case, r, 4) == ctx["baseline"]:
            case.note("flip ran, same tokens")
        elif r.rc == 0:
            case.note("flip ran, different tokens", "a program bit flip ran undetected with different tokens", r)
        else:
            case.note("flip refused")
            if re.search(r"hashes to|checksum|corrupt", r.err):
                case.note("flip caught by checksum")
        return
    if r.rc == 0 and kind != "w-data":  # a data flip cannot be seen at load (no full hash); the rest must be
        case.bad_output(f"ran on a damaged export ({kind})", r)
    if r.rc == 0:
        tokens_of(case, r, 4)
    if kind == "swap" and r.rc == 1 and "different exports" not in r.err:
        case.bad_output("mixed exports refused without saying 'different exports'", r)
    if kind.startswith("w-"):
        v = case.run(["inspect", "--verify", d], primary=False)
        if v.rc == 1:
            case.verify_found = True
            case.expect_clear(v, [d])
        if v.rc != 1 or kind == "w-data" and "corrupt" not in v.err:
            case.bad_output(f"`inspect --verify` did not report the damage ({kind})", v)


def swap_verify(case, M, M2):
    r = case.run(["inspect", "--verify", os.path.join(M, "program.sbp"), "--weights", os.path.join(M2, "weights.safetensors")])
    if r.rc != 1 or "different exports" not in r.err:
        case.bad_output("--verify --weights of another export not refused as 'different exports'", r)
    case.expect_clear(r, ["weights.safetensors"])

# ---------------------------------------------------------------- class 4: output placements
def placement_cases(fx, rounds):
    def pc(label, setup, out="out", expect=None, argv=("--tiny-test", "--bits", "4"), cwd=None, survivors=(), hope=False):
        """setup(case_dir) builds the scene; out and cwd are relative to the case dir; survivors:
        user files whose bytes must be unchanged whatever happens; hope: a reasonable request
        whose refusal is worth a note (not a failure)."""
        def fn(case):
            setup(case.dir)
            keep = {p: snapshot(os.path.join(case.dir, p)) for p in survivors}
            w = os.path.join(case.dir, cwd) if cwd is not None else None
            r = checked_export(case, [a.replace("@", case.dir) for a in argv], out if w else os.path.join(case.dir, out),
                               ["out", "output directory", "program.sbp", "weights.safetensors", case.dir, out + ":"],
                               w, expect)
            if hope and r.rc != 0:
                case.note("reasonable OUT refused", f"refused a reasonable OUT {out!r}", r)
            for p, s in keep.items():
                now = snapshot(os.path.join(case.dir, p))
                if now != s and not (s and now and s[0] == "file" and now[2:] == s[2:]):  # same bytes, new inode: fine
                    case.bad_output(f"user data {p} changed or vanished", r)
            if os.geteuid() == 0 and "read-only" in label:
                case.note("root: chmod 0555 does not stop writes", f"ran as root: export exited {r.rc}", r)
        return (label, fn)

    def mk(*files):
        return lambda d: [(os.makedirs(os.path.dirname(os.path.join(d, f)), exist_ok=True),
                           write(os.path.join(d, f), f"user data {f}")) for f in files]
    prior = lambda d: sb(["export", "--tiny-test", "--bits", "8", "--out", os.path.join(d, "out")])
    readonly = lambda p: lambda d: (mk(p + "/f")(d), os.chmod(os.path.join(d, p), 0o555))
    link = lambda target, name, *files: lambda d: (mk(*files)(d), os.makedirs(os.path.dirname(f"{d}/{name}"), exist_ok=True),
                                                   os.symlink(f"{d}/{target}", f"{d}/{name}"))
    olmoe = lambda dst: lambda d: (os.makedirs(f"{d}/{dst}", exist_ok=True),
                                   [shutil.copy(os.path.join(fx, "olmoe", f), f"{d}/{dst}") for f in ("config.json", "model.safetensors")])
    cut = lambda d: (olmoe("hf")(d), mk("out.partial-keep/mine.txt")(d),
                     write(f"{d}/hf/model.safetensors", open(f"{d}/hf/model.safetensors", "rb").read()[:-100]))
    both = ["out.partial/mine.txt", "out.partial-keep/mine.txt"]
    cases = [
        pc("OUT absent", lambda d: None, expect="ok"),
        pc("OUT an existing regular file", mk("out"), expect="error", survivors=["out"]),
        pc("OUT a dir with unrelated files", mk("out/notes.txt", "out/sub/keep.bin"), survivors=["out/notes.txt", "out/sub/keep.bin"]),
        pc("OUT holding an earlier export", prior, expect="ok"),
        pc("OUT/program.sbp a non-empty dir", mk("out/program.sbp/x", "out/weights.safetensors"), expect="error"),
        pc("OUT/weights.safetensors a non-empty dir", mk("out/weights.safetensors/x", "out/program.sbp"), expect="error"),
        pc("OUT/program.sbp a symlink to a user file", link("victim", "out/program.sbp", "victim"), survivors=["victim"]),
        pc("OUT/weights.safetensors a symlink to a user file", link("victim", "out/weights.safetensors", "victim"),
           survivors=["victim"]),
        pc("read-only parent (0555)", readonly("p"), out="p/out", survivors=["p/f"]),
        pc("read-only OUT (0555) with a file", readonly("out"), survivors=["out/f"]),
        pc("parent missing", lambda d: None, out="no/such/out", expect="error"),
        pc("OUT under a regular file", mk("file"), out="file/out", expect="error", survivors=["file"]),
        pc("OUT ''", lambda d: os.mkdir(d + "/cwd"), out="", cwd="cwd", expect="error"),
        pc("OUT '.' (empty cwd)", lambda d: os.mkdir(d + "/cwd"), out=".", cwd="cwd", hope=True),
        pc("OUT '.' (cwd with a file)", mk("cwd/mine.txt"), out=".", cwd="cwd", survivors=["cwd/mine.txt"], hope=True),
        pc("OUT '..'", mk("cwd/mine.txt", "mine.txt"), out="..", cwd="cwd", survivors=["cwd/mine.txt", "mine.txt"]),
        pc("OUT with a trailing slash (absent)", lambda d: None, out="out/", expect="ok"),
        pc("OUT with a trailing slash (earlier export)", prior, out="out/", expect="ok"),
        pc("OUT a symlink to a dir", link("target", "out", "target/mine.txt"), survivors=["target/mine.txt"], hope=True),
        pc("OUT a dangling symlink", link("nowhere", "out")),
        pc("OUT a symlink to a file", link("victim", "out", "victim"), survivors=["victim"]),
        pc("OUT a FIFO", lambda d: os.mkfifo(d + "/out"), expect="error"),
        pc("OUT.partial and OUT.partial-keep exist (export ok)", mk(*both), expect="ok", survivors=both),
        pc("OUT.partial and OUT.partial-keep exist (export fails early)", mk(*both), argv=["--hf", "@/nowhere"],
           expect="error", survivors=both),
        pc("OUT.partial-keep exists (export fails while converting)", cut, argv=["--hf", "@/hf"], expect="error",
           survivors=["out.partial-keep/mine.txt"]),
        pc("OUT basename 250 chars", lambda d: None, out="o" * 250, hope=True),
        pc("OUT basename 255 chars, existing", lambda d: os.mkdir(d + "/" + "o" * 255), out="o" * 255),
        pc("OUT is the --hf input dir", olmoe("out"), argv=["--hf", "@/out"],
           survivors=["out/config.json", "out/model.safetensors"]),
        pc("OUT with unicode and spaces", lambda d: None, out="ü 模型 out", expect="ok"),
        pc("OUT with a newline", lambda d: None, out="a\nb"),
        pc("OUT starting with a dash", lambda d: None, out="-out", cwd=""),
    ]
    return cases + [(f"concurrent exports, round {i + 1} ({'earlier export' if i % 2 else 'OUT absent'})",
                     lambda case, i=i: concurrent_round(case, i % 2 == 1)) for i in range(rounds)]


def concurrent_round(case, prior):
    """4 exports with different --bits race to one OUT: OUT must end up one whole export of a
    process that exited 0; the others exit 1 saying another export is in progress."""
    out, bits = os.path.join(case.dir, "out"), (2, 3, 4, 8)
    if prior:
        case.run(["export", "--tiny-test", "--bits", "6", "--out", out], primary=False)
    before = staging_names(case.dir)
    argvs = [["export", "--tiny-test", "--bits", str(b), "--out", out] for b in bits]
    procs = [subprocess.Popen([BIN] + a, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for a in argvs]
    deadline, winners = time.monotonic() + TIMEOUT, []
    for b, a, p in zip(bits, argvs, procs):
        try:
            o, e = p.communicate(timeout=max(1, deadline - time.monotonic()))
            r = Res(a, p.returncode, o, e, False)
        except subprocess.TimeoutExpired:
            p.kill()
            r = Res(a, None, *p.communicate(), True)
        case.run(None, primary=False, r=r)
        if r.rc == 0:
            winners.append(b)
        elif r.rc == 1:
            case.expect_clear(r, ["in progress"])
        elif not (case.crash or case.hang):
            case.bad_output(f"concurrent export exited {r.rc}", r)
    case.kind = "ok" if winners else "error"
    case.note(f"{len(winners)} of 4 exports won")
    if case.crash or case.hang:
        return
    if not winners and not prior:
        case.bad_output("no concurrent export succeeded")
    if staging_names(case.dir) - before:
        case.bad_output(f"left behind {sorted(staging_names(case.dir) - before)}")
    v = verify(case, out)  # never one export's program with another's weights
    # attn.o is [1, hidden, hidden * bits / 32] in the tiny model (q, k, v are one projection since v8)
    m = re.search(r"layers\.0\.attn\.o\.weight\s+t\d+ u32 \[\d+, (\d+), (\d+)\]", v.out)
    held = int(m.group(2)) * 32 // int(m.group(1)) if m else None  # packed width -> bits
    if v.rc == 0 and held not in winners + ([6] if prior else []):
        case.bad_output(f"OUT holds a {held}-bit export; the processes that exited 0 exported {winners}", v)

# ---------------------------------------------------------------- driver
def main():
    global BIN, TIMEOUT
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", choices=("ci", "full"), default="ci")
    ap.add_argument("--bin", default=os.path.join(REPO, "build/release/bin/switchboard"))
    ap.add_argument("--work", help="scratch dir (default: a new one under /tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch dir, and the dirs of failing cases")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per invocation; past it counts as a hang")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", help="comma-separated classes: config,safetensors,run,placements")
    # The fixtures are 64 wide with 32-wide expert FFNs: --group-size 64 fails every quantizing
    # export at the flag check, so the alternation uses 32 to actually reach the quantizer.
    ap.add_argument("--group-size", type=int, default=32)
    ap.add_argument("--mem-limit-mb", type=int, default=4096, help="RLIMIT_AS of each CLI process (0: none)")
    ap.add_argument("--failures", help="also write every failing case and note to this JSONL file")
    a = ap.parse_args()
    BIN, TIMEOUT = os.path.abspath(a.bin), a.timeout
    if not os.access(BIN, os.X_OK):
        sys.exit(f"cli_probe: {BIN}: not an executable")
    # Inherited by the CLI: a runaway allocation fails (showing as a crash or an error) instead
    # of exhausting the machine, and crashes leave no core files.
    if a.mem_limit_mb:
        resource.setrlimit(resource.RLIMIT_AS, (a.mem_limit_mb << 20,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    work = os.path.abspath(a.work or tempfile.mkdtemp(prefix="sb-probe-"))
    rnd, t0 = random.Random(a.seed), time.monotonic()
    fx = os.path.join(work, "fixtures")  # private copies: the repo's files are never touched
    for fam in FAMILIES:
        shutil.copytree(os.path.join(REPO, "tests/fixtures", fam, "hf"), os.path.join(fx, fam))
    inputs = {p: sha(p) for fam in FAMILIES for p in (os.path.join(fx, fam, f) for f in os.listdir(os.path.join(fx, fam)))}
    builders = {"config": lambda: config_cases(fx, rnd, a.group_size), "safetensors": lambda: st_cases(fx, rnd, a.group_size),
                "run": lambda: run_cases(work, rnd), "placements": lambda: placement_cases(fx, 5 if a.scale == "full" else 1)}
    only = a.only.split(",") if a.only else list(builders)
    stats, failures, lock = {}, {}, threading.Lock()
    for cls in [c for c in builders if c in only]:
        cases = builders[cls]()
        if a.scale == "ci" and cls != "placements":  # ~5% of each big class, spread over every kind of mutation
            cases = [cases[i] for i in sorted(random.Random(a.seed).sample(range(len(cases)), max(1, len(cases) // 20)))]
        counts = stats[cls] = dict.fromkeys(COUNT_KEYS, 0)
        info, fails, root = counts.setdefault("info", {}), failures.setdefault(cls, []), os.path.join(work, cls)
        os.makedirs(root)
        print(f"[{cls}] {len(cases)} inputs", file=sys.stderr, flush=True)

        def one(i, label, fn):
            case = Case(label, os.path.join(root, str(i)))
            os.mkdir(case.dir)
            try:
                fn(case)
            except Exception:  # a bug in the probe, not in the CLI: say so loudly, keep going
                case.note("probe_errors", "probe error: " + traceback.format_exc(limit=3))
            with lock:
                counts["inputs"] += 1
                key = "crashes" if case.crash else "hangs" if case.hang else case.kind
                if key:  # None: the probe failed before running anything
                    counts[key] += 1
                counts["bad_outputs"] += bool(case.bad)
                counts["unclear_messages"] += case.unclear
                counts["corruption_found_by_verify"] += case.verify_found
                for k in case.info:
                    info[k] = info.get(k, 0) + 1
                if case.events:
                    fails.append({"class": cls, "case": label, "failed": case.failed(), "events": [
                        {"what": w, "cmd": r.cmd if r else "", "exit": r.rc if r else None,
                         "stderr": r.err[:300] if r else ""} for w, r in case.events]})
                if counts["inputs"] % 500 == 0:
                    print(f"[{cls}] {counts['inputs']}/{len(cases)} {time.monotonic() - t0:.0f}s", file=sys.stderr, flush=True)
            if not (a.keep and case.failed()):
                rmtree(case.dir)

        # placements run one at a time: the concurrent rounds start their own 4 processes
        with concurrent.futures.ThreadPoolExecutor(1 if cls == "placements" else a.jobs) as pool:
            for f in [pool.submit(one, i, label, fn) for i, (label, fn) in enumerate(cases)]:
                f.result()

    changed = [p for p, h in inputs.items() if sha(p) != h]
    print(f"\nswitchboard CLI probe: scale {a.scale}, {time.monotonic() - t0:.0f} s wall, binary {BIN}")
    for cls, c in stats.items():
        print(f"\n== {cls}: {c['inputs']} inputs: ok {c['ok']}, error {c['error']}, usage error {c['usage_error']}, "
              f"crashes {c['crashes']}, hangs {c['hangs']}, bad outputs {c['bad_outputs']}, unclear messages "
              f"{c['unclear_messages']}, corruption found by --verify {c['corruption_found_by_verify']}")
        if c["info"]:
            print("   info: " + ", ".join(f"{k}: {v}" for k, v in sorted(c["info"].items())))
        bad, notes = [f for f in failures[cls] if f["failed"]], [f for f in failures[cls] if not f["failed"]]
        if bad or notes:
            print(f"   {len(bad)} failing cases, {len(notes)} notes; showing up to 20 and 5:")
        for f in bad[:20] + notes[:5]:
            print(f"   - {f['case']}")
            for e in f["events"]:
                print(f"       {e['what']}\n         $ {e['cmd']}\n         exit {e['exit']}: {e['stderr'].strip()!r}")
    if changed:
        print(f"\n!! the CLI modified its input files: {changed}")
    if a.failures:
        with open(a.failures, "w") as f:
            f.writelines(json.dumps(x) + "\n" for fl in failures.values() for x in fl)
    if a.keep:
        print(f"\nscratch kept in {work}")
    else:
        rmtree(work)
    print(json.dumps(stats))
    return 1 if changed or any(c["crashes"] or c["hangs"] or c["bad_outputs"] for c in stats.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
