"""Library rules and container refusals added after the issue-4 audit (docs/ENGINE.md §1–§3):
each test names the rule it proves. test_sanitizers.py runs this module again on the
ASan/UBSan build of the binding."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.engine.conftest import EXTENSION_ENV, NATIVE
from tests.engine.manifests import edit_manifest, tensor
from tests.engine.native import open_ctx, try_open
from waste.adapters.native.context import ffi
from waste.adapters.native.context import lib as clib
from waste.domain.ports import EngineError

# Subprocess probes import the conftest first, so they run on the same (maybe ASan) build.
PROBE_PRELUDE = "import tests.engine.conftest\n"


@pytest.fixture(scope="module")
def shared_library(libwaste) -> Path:
    """``native/build/libwaste.so`` (``make -C native`` builds it beside the archive)."""
    return NATIVE / "build" / "libwaste.so"


@pytest.fixture()
def copy(tiny_f32, tmp_path):
    """A fresh copy of the tiny f32 container (with tokenizer files)."""
    dst = tmp_path / "m.waste"
    shutil.copytree(tiny_f32[1], dst)
    return dst


# ---- docs/ENGINE.md §3: only the input embedding is read from disk ---------------------------
@pytest.mark.parametrize("name", ["lm_head", "final_norm", "blk.1.moe.router", "blk.0.kda.q_proj"])
def test_on_disk_is_refused_except_for_the_embedding(copy, name):
    edit_manifest(copy, lambda m: tensor(m, name).update(on_disk=True))
    st, detail, ctx = try_open(copy)
    assert ctx is None
    assert st == "E_FORMAT" and f"tensor {name}: on_disk" in detail, detail


def test_a_resident_embedding_is_fine(copy):
    edit_manifest(copy, lambda m: tensor(m, "embed").update(on_disk=False))
    with open_ctx(copy) as c:
        assert c.eval_status([3, 4, 5]) == ("OK", "")


# ---- docs/ENGINE.md §4.3: transcendentals are the engine's own -------------------------------
def test_the_library_imports_no_transcendentals_from_libm(shared_library):
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed: cannot list libwaste's imports")
    import subprocess

    out = subprocess.run([nm, "-D", "--undefined-only", str(shared_library)], capture_output=True, text=True, check=True).stdout
    imported = {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}
    libm = {"exp", "expf", "log", "logf", "log1p", "log1pf", "expm1", "expm1f", "tanh", "tanhf", "pow", "powf",
            "exp2", "exp2f"}
    assert not imported & libm, f"libwaste imports {sorted(imported & libm)} from libm"
    # sqrt and fma are IEEE-exact (correctly rounded), so libm's are allowed.


# ---- the C tests (native/tests/test_*.c) under pytest -----------------------------------
def test_c_tests_pass(libwaste):
    """``make -C native test``: API rules, sampling, numerics, manifest fuzzing with data files.
    (test_sanitizers.py runs the same binaries built with ASan/UBSan.)"""
    import subprocess

    if os.environ.get(EXTENSION_ENV):
        pytest.skip("this session runs on the ASan build; test_sanitizers.py runs `make test-asan` itself")

    proc = subprocess.run(["make", "-C", str(NATIVE), "test"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for name in ("test_api: ok", "test_sampling: ok", "test_numerics:", "test_kernels: ok", "data campaign: 1000 runs"):
        assert name in proc.stdout, proc.stdout[-4000:]


# ---- docs/ENGINE.md §1: invalid UTF-8 is E_ARG, through the binding --------------------------
def test_invalid_utf8_is_refused_by_c_naming_the_byte(tiny_f32):
    """The C entry points refuse invalid bytes (the binding refuses lone surrogates before C,
    test_binding.py); valid text still round-trips."""
    with open_ctx(tiny_f32[1]) as c:
        for markup in (False, True):
            with pytest.raises(EngineError) as info:
                c.tokenize(b"ab\xed\xa0\x80c", markup)     # a UTF-8-encoded surrogate at byte 2
            assert info.value.code == "E_ARG" and "invalid UTF-8 at byte 2" in info.value.detail
        assert c.detokenize(c.tokenize("ok é".encode())) == "ok é".encode()


# ---- docs/ENGINE.md §2 Pieces: a stop inside a character leaves the rest in the tail ---------
def test_pieces_plus_tail_equal_detokenize_when_the_callback_stops(tiny_f32):
    from waste.adapters.native import NativeEngine, NativeOptions
    from waste.domain.ports import SamplingParams

    with NativeEngine.open(tiny_f32[1], NativeOptions(usage_path="", n_threads=1)) as engine:
        n_text = engine.n_base_vocab + 4            # tiny.SPECIALS: ids above have no text
        cut = 0
        for seed in range(120):
            events = []

            def on_token(event, events=events):
                events.append(event)
                return event.piece == b"" and event.token < n_text   # bytes held back: stop here

            engine.reset()
            result = engine.generate_ids([5, 9, 11], SamplingParams(temperature=3.0, seed=seed, max_tokens=40),
                                     on_token)
            ids = [e.token for e in events]
            if any(i >= n_text for i in ids):
                continue
            stream = b"".join(e.piece for e in events)
            assert stream + result.tail == engine.detokenize(ids)
            if result.stop_reason == "callback":
                assert 1 <= len(result.tail) <= 3
                cut += 1
            else:
                assert result.tail == b""
        assert cut >= 3, "no run stopped inside a multi-byte character"


# ---- cfg.kernels selects a kernel set; all give the same logits bytes ------------------
@pytest.fixture(scope="module")
def kinds(torch_stack, tiny_dir, tiny_f32):
    """f32 tiny (A), odd widths (C, kernel tails), bf16 and int8 g32 (Q)."""
    from tests.engine import tiny

    _, c_hf = tiny.make_checkpoint(torch_stack, tiny_dir / "hf-c-rules", tiny.CONFIG_C, seed=2)
    _, q_hf = tiny.make_checkpoint(torch_stack, tiny_dir / "hf-q-rules", tiny.CONFIG_Q, seed=3)
    return {
        "f32": tiny_f32[1],
        "f32-odd": tiny.convert(c_hf, tiny_dir / "c-rules.waste", "f32"),
        "bf16": tiny.convert(q_hf, tiny_dir / "q-rules-bf16.waste", "bf16"),
        "int8": tiny.convert(q_hf, tiny_dir / "q-rules-int8.waste", "int8"),
    }


def prompt_of(n, vocab, seed=5):
    import numpy as np

    return [int(x) for x in np.random.default_rng(seed).integers(3, vocab, n)]


def per_token(ctx, ids):
    import numpy as np

    return np.array([ctx.eval([t]) for t in ids])


def same_bytes(a, b) -> bool:
    import numpy as np

    return np.asarray(a, np.float32).tobytes() == np.asarray(b, np.float32).tobytes()


@pytest.mark.parametrize("kind", ["f32", "f32-odd", "bf16", "int8"])
def test_every_available_kernel_set_gives_identical_logits(kinds, kind):
    path = kinds[kind]
    with open_ctx(path, kernels=1) as generic:
        ids = prompt_of(40, generic.vocab)
        ref = per_token(generic, ids)
    compared = []
    for k, name in ((2, "avx2"), (3, "avx512")):
        st, detail, ctx = try_open(path, kernels=k)
        if ctx is None:
            assert st == "E_UNSUPPORTED" and f"({name})" in detail, detail
            continue
        with ctx:
            assert same_bytes(per_token(ctx, ids), ref), f"kernels {name} differ from generic"
        compared.append(name)
    if not compared:
        pytest.skip("this CPU has neither AVX2+FMA nor AVX-512F: only generic kernels to run")


def test_binding_options_name_the_kernel_sets(tiny_f32):
    from waste.adapters.native import NativeEngine, NativeOptions
    from waste.domain.ports import EngineError

    for name in ("auto", "generic", "avx2", "avx512"):
        try:
            engine = NativeEngine.open(tiny_f32[1], NativeOptions(usage_path="", kernels=name))
        except EngineError as exc:
            assert name in ("avx2", "avx512") and exc.code == "E_UNSUPPORTED" and name in exc.detail
        else:
            engine.close()
    with pytest.raises(ValueError):
        NativeOptions(kernels="sse9")


# ---- bf16: chunked prefill and snapshots are exact too ----------------------------------
def test_bf16_prefill_chunking_is_exact(kinds):
    path = kinds["bf16"]
    with open_ctx(path, prefill_chunk=1) as c1:
        ids = prompt_of(150, c1.vocab)
        ref = per_token(c1, ids)[-1]
    for chunk in (7, 64):
        with open_ctx(path, prefill_chunk=chunk) as c:
            assert same_bytes(c.eval(ids), ref), f"prefill_chunk={chunk} differs from token by token"


def test_bf16_snapshot_restore_then_suffix_equals_fresh_prefill(kinds):
    with open_ctx(kinds["bf16"]) as c:
        ids = prompt_of(60, c.vocab)
        fresh = c.eval(ids)
        c.reset()
        c.eval(ids[:41])
        blob = c.snapshot()
        c.eval(prompt_of(9, c.vocab, seed=99))
        c.reset()
        assert c.restore_status(blob) == ("OK", "")
        assert same_bytes(c.eval(ids[41:]), fresh)


# ---- int8 group 128: the engine against transformers on the dequantized weights ---------
def test_int8_group_128_matches_transformers_on_its_dequantized_weights(torch_stack, tiny_dir,
                                                                        report_measurement):
    import numpy as np

    from tests.engine import tiny
    from waste.tools.convert import convert

    torch, _ = torch_stack
    _, hf = tiny.make_checkpoint(torch_stack, tiny_dir / "hf-g128", tiny.CONFIG_G128, seed=4)
    path = tiny_dir / "g128.waste"
    if not path.exists():
        convert(hf, path, trunk="int8", experts="int8", group=128)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["banks"][0]["format"] == "int8" and manifest["banks"][0]["group"] == 128
    assert any(t["format"] == "int8" and t["group"] == 128 for t in manifest["tensors"])
    twin = tiny.quantized_twin(torch_stack, hf, "int8", group=128)
    prompt = prompt_of(40, 512, seed=11)
    with torch.no_grad():
        ref = twin(torch.tensor([prompt])).logits[0].double().numpy()
    with open_ctx(path) as c:
        got = np.array([c.eval([t]) for t in prompt], dtype=np.float64)
    err = float(np.abs(got - ref).max())
    agreement = float((got.argmax(1) == ref.argmax(1)).mean())
    report_measurement(f"int8 g128 vs its dequantized twin{'':<24} max-abs {err:.3e}  argmax agreement "
                       f"{agreement:.3f} over {len(prompt)} positions")
    assert err < 1e-3
    assert (got.argmax(1) == ref.argmax(1)).all()


# ---- docs/ENGINE.md §3: manifest validation -------------------------------------------------
def drop_banks_and_sparse(m):
    """Every layer dense (so no bank is needed): a manifest plan can read on its own."""
    m["config"]["mlp_layer_types"] = ["dense"] * m["config"]["num_hidden_layers"]
    m["banks"] = []


@pytest.mark.parametrize("mutate,needle", [
    (lambda m: m["config"].update(bos_token_id=100000), "config.bos_token_id 100000 is not below vocab_size 512"),
    (lambda m: m["config"].update(eos_token_id=512), "config.eos_token_id 512 is not below vocab_size"),
    (lambda m: m["config"].update(pad_token_id=2**31 - 1), "config.pad_token_id"),
    (lambda m: m["tensors"].append(dict(tensor(m, "final_norm"), name="pad.0")), "tensor pad.0 is not a tensor of"),
    (lambda m: m["tensors"].append(dict(tensor(m, "final_norm"), name="blk.4.attn_norm")), "tensor blk.4.attn_norm"),
    (lambda m: m["tensors"].append(dict(tensor(m, "final_norm"), name="blk.01.attn_norm")), "tensor blk.01.attn_norm"),
    (lambda m: m["tensors"].append(dict(tensor(m, "final_norm"), name="blk.0.mla.kv_a_norm")), "blk.0.mla.kv_a_norm"),
    (lambda m: m["tensors"].append(dict(tensor(m, "final_norm"), name="blk.1.ffn.gate")), "blk.1.ffn.gate"),
    (lambda m: m["tensors"].append(dict(tensor(m, "final_norm"))), "duplicate tensor final_norm"),
    (lambda m: m["banks"].reverse(), "banks must be in layer order"),
])
def test_manifest_gaps_are_refused_by_name(copy, mutate, needle):
    edit_manifest(copy, mutate)
    st, detail, ctx = try_open(copy)
    assert ctx is None
    assert st == "E_FORMAT" and needle in detail, detail


@pytest.mark.parametrize("where", ["top", "config", "tensor", "wide"])
def test_duplicate_json_keys_are_refused_naming_the_key(copy, where):
    text = (copy / "manifest.json").read_text()
    if where == "top":
        text = text.replace('"arch": "kimi_linear"', '"arch": "kimi_linear", "arch": "glm5"', 1)
        key = "arch"
    elif where == "config":
        text = text.replace('"hidden_size": 64', '"hidden_size": 64, "hidden_size": 64', 1)
        key = "hidden_size"
    elif where == "tensor":
        text = text.replace('"on_disk": false', '"on_disk": false, "on_disk": true', 1)
        key = "on_disk"
    else:   # an object with many keys takes the sorted path
        extra = ", ".join(f'"k{i}": {i}' for i in range(40))
        text = text.replace('"format_version": 1', '"format_version": 1, ' + extra + ', "k17": 0', 1)
        key = "k17"
    (copy / "manifest.json").write_text(text)
    st, detail, _ = try_open(copy)
    assert st == "E_FORMAT" and f'duplicate key "{key}"' in detail, detail


def test_duplicate_special_keys_are_refused(copy):
    specials = json.loads((copy / "specials.json").read_text())
    text = json.dumps(specials).replace('"text": ', '"text": "x", "text": ', 1)
    (copy / "specials.json").write_text(text)
    st, detail, _ = try_open(copy)
    assert st == "E_FORMAT" and 'duplicate key "text"' in detail and "specials.json" in detail, detail


def test_manifest_strings_must_be_utf8(copy):
    raw = (copy / "manifest.json").read_bytes().replace(b'"arch": "kimi_linear"', b'"arch": "kimi\xff"', 1)
    (copy / "manifest.json").write_bytes(raw)
    st, detail, _ = try_open(copy)
    assert st == "E_FORMAT" and "invalid UTF-8 in a string at byte" in detail, detail


def test_details_are_valid_utf8_even_for_byte_paths(tmp_path):
    err = ffi.new("char[512]")
    out = ffi.new("waste_ctx **")
    path = str(tmp_path).encode() + b"/caf\xe9\xff.waste"           # latin-1 bytes: not UTF-8
    assert clib.waste_open(path, ffi.NULL, out, err, 512) == -1
    detail = ffi.string(err).decode("utf-8")                           # strict: must decode
    assert "caf\\xE9\\xFF.waste/manifest.json" in detail, detail


def test_many_tensors_are_indexed_not_compared_pairwise(copy):
    """65,536 tensors (the limit), all canonical: plan reads them and still finds a
    duplicate placed last (the check is a sort, not n² comparisons)."""
    def grow(m):
        n_layers = 65536 // 17 + 1
        m["config"]["num_hidden_layers"] = n_layers
        m["config"]["layer_types"] = ["linear_attention"] * n_layers
        drop_banks_and_sparse(m)
        proto = tensor(m, "final_norm")
        names = [f"blk.{l}.kda.{x}" for l in range(n_layers) for x in (
            "q_proj", "k_proj", "v_proj", "q_conv", "k_conv", "v_conv", "a_log", "dt_bias", "f_a", "f_b",
            "b_proj", "g_a", "g_b", "o_norm", "o_proj")] + [f"blk.{l}.ffn.{x}" for l in range(n_layers)
                                                             for x in ("gate", "up")]
        m["tensors"] = [dict(proto, name=n) for n in names[:65535]] + [dict(proto, name=names[7])]

    edit_manifest(copy, grow)
    plan = ffi.new("waste_plan *")
    clib.waste_plan_init(plan)
    err = ffi.new("char[512]")
    assert clib.waste_plan_memory(str(copy).encode(), ffi.NULL, plan, err, 512) == -2
    assert "duplicate tensor blk.0.kda.dt_bias" in ffi.string(err).decode()


# ---- JSON numbers and details do not depend on the host's LC_NUMERIC ---------------------
LOCALE_PROBE = PROBE_PRELUDE + r'''
import ctypes, json, locale, sys
from tests.engine.native import try_open
try:
    locale.setlocale(locale.LC_NUMERIC, "de_DE.UTF-8")
except locale.Error as exc:
    print(json.dumps({"skip": str(exc)}))
    sys.exit(0)
libc = ctypes.CDLL(None)
buf = ctypes.create_string_buffer(32)
libc.snprintf(buf, 32, b"%g", ctypes.c_double(2.5))
good, bad = sys.argv[1:3]
st_good, detail_good, ctx = try_open(good)
if ctx is not None:
    ctx.close()
st_bad, detail_bad, _ = try_open(bad)
print(json.dumps({"c_formats": buf.value.decode(), "good": [st_good, detail_good], "bad": [st_bad, detail_bad]}))
'''


def test_json_numbers_and_details_ignore_the_host_locale(copy, tmp_path):
    import subprocess
    import sys

    localedef = shutil.which("localedef")
    if localedef is None:
        pytest.skip("localedef is not installed: cannot build a decimal-comma locale to test with")
    locales = tmp_path / "locales"
    locales.mkdir()
    plain = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}   # not under the ASan runtime
    made = subprocess.run([localedef, "-i", "de_DE", "-f", "UTF-8", str(locales / "de_DE.UTF-8")],
                          capture_output=True, text=True, env=plain, stdin=subprocess.DEVNULL)
    if not (locales / "de_DE.UTF-8").exists():
        pytest.skip(f"localedef could not build de_DE.UTF-8 (no locale sources?): {made.stderr[-300:]}")
    bad = tmp_path / "bad.waste"
    shutil.copytree(copy, bad)
    edit_manifest(bad, lambda m: m.update(format_version=1.5))
    from tests.engine.conftest import REPO

    env = dict(os.environ, LOCPATH=str(locales))
    run = subprocess.run([sys.executable, "-c", LOCALE_PROBE, str(copy), str(bad)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    if "skip" in out:
        files = sorted(p.name for p in (locales / "de_DE.UTF-8").iterdir())
        pytest.skip(f"the de_DE.UTF-8 locale built by localedef does not load: {out['skip']} "
                    f"(localedef {made.returncode}: {made.stderr[-300:]}; {files})")
    assert out["c_formats"] == "2,5", out        # the host's C library really uses a decimal comma
    assert out["good"] == ["OK", ""], out          # 1e-05, 2.446 ... still parse
    assert out["bad"][0] == "E_FORMAT" and "format_version 1.5 is not supported" in out["bad"][1], out


# ---- docs/ENGINE.md §3/§5: overflow-checked sizing ---------------------------------------------
def test_a_floor_beyond_u64_is_refused_naming_the_sum(copy):
    """16,383 canonical [2^24, 2^24] f32 tensors (2^50 bytes each) make a trunk just under
    2^64 — resident bytes fit — and two MLA layers with kv_lora_rank 2^24 at ctx_tokens 2^24
    add 2^51 bytes of state: the floor sum overflows u64 (it used to wrap)."""
    n_kda = 1366
    big = 1 << 24

    def grow(m):
        cfg = m["config"]
        cfg.update(num_hidden_layers=n_kda + 2, kv_lora_rank=big,
                   layer_types=["linear_attention"] * n_kda + ["full_attention"] * 2)
        drop_banks_and_sparse(m)
        mats = ("q_proj", "k_proj", "v_proj", "f_a", "f_b", "b_proj", "g_a", "g_b", "o_proj")
        names = [f"blk.{l}.kda.{x}" for l in range(n_kda) for x in mats] + \
                [f"blk.{l}.ffn.{x}" for l in range(n_kda) for x in ("gate", "up", "down")]
        m["tensors"] = [dict(name=n, format="f32", group=0, shape=[big, big], file="trunk.bin", offset=0,
                             length=4 * big * big, on_disk=False) for n in names[:16383]]

    edit_manifest(copy, grow)
    cfg = ffi.new("waste_cfg *")
    clib.waste_cfg_init(cfg)
    cfg.ctx_tokens = big
    plan = ffi.new("waste_plan *")
    clib.waste_plan_init(plan)
    err = ffi.new("char[1024]")
    st = clib.waste_plan_memory(str(copy).encode(), cfg, plan, err, 1024)
    detail = ffi.string(err).decode()
    assert st == -2 and "memory sizing overflows u64: floor = trunk 18445618173802708992" in detail, (st, detail)


# ---- FIFOs, devices and huge files are refused by name, never waited on -----------------
OPEN_PROBE = PROBE_PRELUDE + r'''
import json, sys
from tests.engine.native import try_open
st, detail, ctx = try_open(sys.argv[1], usage_path=sys.argv[2])
note = ""
if ctx is not None:
    stats = ctx.stats()                      # keep the owner alive while reading its field
    note = ctx.ffi.string(stats.usage_note).decode()
    ctx.close()
print(json.dumps([st, detail, note]))
'''


def open_in_subprocess(path, usage_path=""):
    """try_open in a child with a timeout: a library that blocks on a FIFO fails, not hangs."""
    import subprocess
    import sys

    from tests.engine.conftest import REPO

    run = subprocess.run([sys.executable, "-c", OPEN_PROBE, str(path), usage_path], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["manifest.json", "trunk.bin", "experts-L1.bin", "tokenizer.tiktoken", "specials.json"])
def test_a_fifo_in_place_of_a_container_file_is_refused(copy, name):
    (copy / name).unlink()
    os.mkfifo(copy / name)
    st, detail, _ = open_in_subprocess(copy)
    assert st == "E_IO" and f"{name}: not a regular file" in detail, detail


def test_a_fifo_hotlist_is_ignored_not_waited_on(copy):
    os.mkfifo(copy / "usage.waste")
    st, detail, note = open_in_subprocess(copy, usage_path=str(copy / "usage.waste"))
    assert st == "OK" and "usage.waste ignored: not a regular file" in note, (st, detail, note)


def test_a_device_as_specials_is_refused(copy):
    (copy / "specials.json").unlink()
    os.symlink("/dev/zero", copy / "specials.json")
    st, detail, _ = open_in_subprocess(copy)
    assert st == "E_IO" and "specials.json: not a regular file" in detail, detail


@pytest.mark.parametrize("name", ["tokenizer.tiktoken", "specials.json"])
def test_tokenizer_files_have_a_size_limit(copy, name):
    with open(copy / name, "r+b") as f:
        f.truncate((64 << 20) + 1)                                    # sparse: nothing is written
    st, detail, _ = open_in_subprocess(copy)
    assert st == "E_FORMAT" and f"{name}: 67108865 bytes, above the 64 MiB limit" in detail, detail
