"""``featurestream demo --target hf-*``: the draft trains on features of a random-init Hugging Face model."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("transformers", reason="the HF demo tests need transformers: pip install 'featurestream[hf]'")

from featurestream.cli import main

FAST = ["--samples", "16", "--crash-every", "7", "--fail-rate", "0.1", "--visibility-timeout", "0.3", "--seed", "2"]


def test_demo_default_then_hf_llama_in_a_fresh_interpreter_prints_no_warnings() -> None:
    """The default demo imports no transformers; hf-llama trains on a LlamaForCausalLM; stderr stays empty."""
    code = (
        "import sys\n"
        "from featurestream.cli import main\n"
        f"tiny = main(['demo', '--no-progress', *{FAST!r}])\n"
        "print('transformers imported by the default demo:', 'transformers' in sys.modules)\n"
        f"hf = main(['demo', '--no-progress', '--target', 'hf-llama', *{FAST!r}])\n"
        "sys.exit(tiny or hf)\n"
    )
    done = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == "", "no library warnings (nor anything else) on stderr"
    tiny, hf = done.stdout.split("featurestream demo: ")[1:]
    assert "target                tiny: TinyTargetModel" in tiny
    assert "transformers imported by the default demo: False" in tiny
    assert "target                hf-llama: LlamaForCausalLM (random init, transformers), 8 layers" in hf
    assert "aux layers (1, 3, 4)" in hf
    for out in (tiny, hf):
        assert "FAILED" not in out and out.count("[ok]") == 6 and "the draft's loss fell" in out, out


@pytest.mark.parametrize("target", ["hf-qwen2", "hf-qwen3", "hf-mistral"])
def test_every_hf_family_runs_the_demo(target: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--target", target, "--no-progress", *FAST]) == 0
    out = capsys.readouterr().out
    assert f"target                {target}: " in out and "FAILED" not in out and out.count("[ok]") == 6, out


def test_an_hf_target_without_transformers_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    assert main(["demo", "--target", "hf-llama", "--no-progress", "--samples", "4"]) == 2
    assert "pip install 'featurestream[hf]'" in capsys.readouterr().err


def test_unknown_targets_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--target", "hf-gpt9"])
    assert "invalid choice: 'hf-gpt9'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("algorithm", "target", "wrapper"),
    [("dflash", "hf-qwen3", "HFDFlashTargetModel"), ("dspark", "hf-llama", "HFDSparkTargetModel")],
)
def test_dflash_and_dspark_drafts_train_on_an_hf_targets_features(
    algorithm: str, target: str, wrapper: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fast = [*FAST[:1], "24", *FAST[2:]]  # a few more steps than FAST: the drafts start from scratch
    assert main(["demo", "--algorithm", algorithm, "--target", target, "--no-progress", *fast]) == 0
    out = capsys.readouterr().out
    # Three layers spread as the reference's DFlash recipe spreads them, captured by featurestream's wrapper.
    assert f"8 layers, aux layers (1, 3, 5), through {wrapper}" in out
    assert "FAILED" not in out and out.count("[ok]") == 6 and "[ok] the draft's loss fell" in out, out
