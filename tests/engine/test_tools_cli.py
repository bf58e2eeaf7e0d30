"""The three tools as a user runs them: ``python -m waste.tools.{make_container,convert,eval}``
in subprocesses — outputs, determinism, and every refusal by name with its exit code (1 for
a failure, 2 for a bad flag) and no traceback. Geometries are tiny, runs are concurrent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.conftest import REPO
from waste.adapters.native import NativeEngine, NativeOptions
from waste.tools import make_container as mc

TINY = ["--layers", "2", "--layout", "KM", "--hidden", "32", "--intermediate", "32",
        "--moe-intermediate", "32", "--experts", "2", "--top-k", "1", "--kda-heads", "1",
        "--mla-heads", "1", "--vocab-merges", "16"]


def start(tool: str, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", f"waste.tools.{tool}", *map(str, args)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def run(tool: str, *args) -> tuple[int, str, str]:
    return finish(start(tool, *args))


def refused(result, code: int, *needles: str) -> None:
    rc, out, err = result
    assert rc == code and out == "", (rc, out, err)
    assert "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


# ---- make_container ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def made(tmp_path_factory, libwaste):
    """Every --chat-json variant, plus a rerun and another seed of the default one."""
    root = tmp_path_factory.mktemp("made")
    jobs = {name: (root / f"{name}.waste", [*TINY, *flags]) for name, flags in {
        "xtml": ["--chat-json", "xtml"], "kimi-linear": ["--chat-json", "kimi-linear"],
        "glm": ["--chat-json", "glm"], "none": ["--chat-json", "none"],
        "xtml-again": [], "seed-7": ["--seed", "7"]}.items()}
    procs = {name: start("make_container", out, *flags) for name, (out, flags) in jobs.items()}
    for name, proc in procs.items():
        rc, out, err = finish(proc)
        assert rc == 0 and out.strip() == str(jobs[name][0]), (name, rc, err)
    return {name: out for name, (out, _) in jobs.items()}


def specials_of(path: Path) -> list[str]:
    return [s["text"] for s in json.loads((path / "specials.json").read_text())]


@pytest.mark.parametrize("variant", ["xtml", "kimi-linear", "glm", "none"])
def test_each_chat_json_variant(made, variant):
    path = made[variant]
    specials = specials_of(path)
    assert specials[-1] == "[EOS]"
    expected = {"xtml": list(mc.XTML_SPECIALS) + ["[EOS]"], "none": ["[EOS]"],
                "kimi-linear": list(mc.KIMI_LINEAR_SPECIALS + mc.K2_TOOL_MARKERS) + ["[EOS]"]}
    if variant in expected:
        assert specials == expected[variant]
    else:
        assert "[gMASK]" in specials and "<|assistant|>" in specials
        assert set(mc.GLM_TOOL_MARKERS) <= set(specials)  # its chat.json says "tools": "glm"
    example = REPO / "examples" / f"chat-{variant}.json"
    if example.exists():
        wanted = json.loads(example.read_text())
        if variant == "glm":  # no vision tower: the synthetic container drops the image block
            wanted.pop("image")
        assert json.loads((path / "chat.json").read_text()) == wanted
    else:
        assert not (path / "chat.json").exists()
    with NativeEngine.open(path, NativeOptions(usage_path="")) as engine:
        info = engine.model_info()
        assert (info.n_layers, info.n_experts, info.hidden) == (2, 2, 32)
        assert info.eos_id == engine.special_id("[EOS]") == info.vocab - 1
        assert engine.chat_template() == ((path / "chat.json").read_text() if example.exists() else None)


def test_same_seed_is_byte_identical_and_another_differs(made):
    a, again, other = made["xtml"], made["xtml-again"], made["seed-7"]
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in again.iterdir()) == sorted(p.name for p in other.iterdir())
    assert all((a / n).read_bytes() == (again / n).read_bytes() for n in names)
    assert (a / "trunk.bin").read_bytes() != (other / "trunk.bin").read_bytes()
    assert (a / "experts-L1.bin").read_bytes() != (other / "experts-L1.bin").read_bytes()
    assert (a / "tokenizer.tiktoken").read_bytes() == (other / "tokenizer.tiktoken").read_bytes()


@pytest.mark.parametrize("flags,code,needles", [
    (["--layers", "0"], 2, ["--layers must be a positive integer, got 0"]),
    (["--layers", "x"], 2, ["argument --layers: invalid int value: 'x'"]),
    (["--top-k", "9"], 2, ["--top-k 9 exceeds --experts 8"]),
    (["--layout", "KKX"], 2, ["--layout 'KKX' must be 4 letters K (KDA) or M (MLA)"]),
    (["--chat-json", "llama"], 2, ["argument --chat-json: invalid choice: 'llama'"]),
    (["--dtype", "mxfp4"], 2, ["argument --dtype: invalid choice: 'mxfp4'"]),
    (["--dtype", "int4", "--hidden", "48"], 1, ["--dtype int4: tensor", "48 columns, not a multiple of the group 32"]),
    (["--seed", "-1"], 2, ["--seed must be a non-negative integer, got -1"]),
    (["--shared", "-1"], 2, ["shared"]),
    (["--dtype", "int8", "--hidden", "48"], 1, ["--dtype int8: tensor", "48 columns, not a multiple of the group 32"]),
])
def test_make_container_refuses_bad_flags_by_name(tmp_path, flags, code, needles):
    refused(run("make_container", tmp_path / "x.waste", *flags), code, *needles)
    assert list(tmp_path.iterdir()) == []


def test_make_container_refuses_an_existing_output(made):
    refused(run("make_container", made["none"], "--chat-json", "none"), 1, f"{made['none']} already exists")


def test_missing_chat_example_is_a_clear_error(tmp_path, monkeypatch, capsys):
    """The kimi-linear and glm chat.json come from the source tree's examples/; without them
    (a packaged install) the variant is refused naming the file, nothing is written."""
    monkeypatch.setattr(mc, "EXAMPLES", tmp_path / "no-examples")
    assert mc.main([str(tmp_path / "x.waste"), "--chat-json", "glm", *TINY]) == 1
    err = capsys.readouterr().err
    assert f"--chat-json glm copies {tmp_path / 'no-examples' / 'chat-glm.json'}, which is not there" in err
    assert [p.name for p in tmp_path.iterdir()] == []


# ---- convert -------------------------------------------------------------------------------
def test_convert_cli_writes_the_same_container_as_the_api(tiny_hf, tiny_f32, tmp_path):
    _, hf = tiny_hf
    out = tmp_path / "cli.waste"
    rc, stdout, err = run("convert", hf, out, "--dtype", "f32")
    assert rc == 0 and stdout.strip() == str(out), err
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in tiny_f32[1].iterdir())
    assert all((out / n).read_bytes() == (tiny_f32[1] / n).read_bytes() for n in names)
    refused(run("convert", hf, out, "--dtype", "f32"), 1, f"convert: error: {out} already exists")


def test_convert_cli_shows_progress_and_throughput(tiny_hf, tmp_path):
    """A tqdm bar on stderr (bytes read, rate), then the throughput line (issue 11)."""
    _, hf = tiny_hf
    source = sum(p.stat().st_size for p in Path(hf).glob("*.safetensors"))
    rc, stdout, err = run("convert", hf, tmp_path / "p.waste", "--dtype", "f32")
    assert rc == 0, err
    assert "convert: 100%" in err and "B/s" in err                  # the bar reached its total
    line = [l for l in err.splitlines() if l.startswith("convert: read ")]
    assert line and "GiB) in" in line[0] and "MiB/s" in line[0], err
    read = int(line[0].split()[2].replace(",", ""))
    assert 0 < read <= source


@pytest.mark.parametrize("flags,needle", [
    (["--group", "64"], "argument --group: invalid choice: 64"),
    (["--dtype", "f32", "--trunk", "bf16"], "--dtype sets both --trunk and --experts"),
    (["--dtype", "mxfp4"], "argument --dtype: invalid choice: 'mxfp4'"),
    (["--experts", "fp8"], "argument --experts: invalid choice: 'fp8'"),
])
def test_convert_refuses_bad_flags_by_name(tiny_hf, tmp_path, flags, needle):
    refused(run("convert", tiny_hf[1], tmp_path / "x.waste", *flags), 2, needle)
    assert list(tmp_path.iterdir()) == []


def test_convert_of_a_missing_directory_is_one_error_line(tmp_path):
    rc, out, err = run("convert", tmp_path / "nope", tmp_path / "x.waste")
    refused((rc, out, err), 1, "convert: error: ", str(tmp_path / "nope" / "config.json"))
    assert len(err.splitlines()) == 1


# ---- eval ----------------------------------------------------------------------------------
def engine_logits(path: Path, ids: list[int]) -> list[float]:
    with NativeEngine.open(path, NativeOptions(usage_path="")) as engine:
        return engine.eval(ids)


def test_eval_prints_the_last_logits(synthetic_f32):
    ids = [3, 40, 7, 300]
    expected = engine_logits(synthetic_f32, ids)
    text, as_json = start("eval", synthetic_f32, "--ids", "3, 40,7,300"), \
        start("eval", synthetic_f32, "--ids", "3,40,7,300", "--json", "--kernels", "generic", "--threads", "1")
    rc, out, err = finish(text)
    assert rc == 0, err
    values = [float(x) for x in out.split()]
    assert len(values) == len(expected) and values == pytest.approx(expected, rel=1e-5, abs=1e-6)
    rc, out, err = finish(as_json)
    assert rc == 0, err
    assert json.loads(out) == expected                       # exact: the kernels are bit-identical


@pytest.mark.parametrize("ids,needle", [
    ("3000000000", "--ids[0] = 3000000000 is not a token id of this model (0..505)"),
    ("1,506", "--ids[1] = 506 is not a token id of this model (0..505)"),
    ("1,-2", "--ids[1] = -2 is not a token id"),
    ("1,x", "--ids[1] = 'x' is not an integer"),
    ("", "--ids[0] = '' is not an integer"),
])
def test_eval_refuses_bad_ids_by_position(synthetic_f32, ids, needle):
    refused(run("eval", synthetic_f32, "--ids", ids), 2, needle)


def test_eval_error_paths(synthetic_f32, tmp_path):
    procs = [start("eval", tmp_path / "nope.waste", "--ids", "1"),
             start("eval", synthetic_f32, "--ids", "1", "--kernels", "avx9"),
             start("eval", synthetic_f32, "--ids", "1", "--threads", "-1"),
             start("eval", synthetic_f32)]
    refused(finish(procs[0]), 1, "eval: error: E_IO: ", str(tmp_path / "nope.waste"))
    refused(finish(procs[1]), 2, "argument --kernels: invalid choice: 'avx9'")
    refused(finish(procs[2]), 2, "n_threads must be an integer in 0..")
    refused(finish(procs[3]), 2, "the following arguments are required: --ids")
