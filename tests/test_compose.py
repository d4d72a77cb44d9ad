"""The compose screen, driven by Textual's Pilot: the form generated from the spec's option
table, inline validation, what is shown per backend/strategy, the live preview (command,
port, trainer values, batch, memory against recorded GPUs), save, presets, the advisor."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
from textual.app import App
from textual.widgets import DataTable, Input, Select

from tests.conftest import DEMO, REPO, screen_host, until
from tunedeck.core.spec import OPTIONS, RunSpec, load_spec, set_values
from tunedeck.core.telemetry.fake import FakePynvml
from tunedeck.core.telemetry.gpus import Gpu, GpuFacts, probe_gpus
from tunedeck.tui.screens.compose import AdviceScreen, ComposeScreen, widget_id
from tunedeck.tui.screens.prompt import PromptScreen
from tunedeck.tui.screens.preflight import PreflightScreen
from tunedeck.tui.screens.presets import PresetPicker

DEMO_DATA = REPO / "presets" / "data" / "demo_chat.jsonl"


def h200s(n: int = 2) -> GpuFacts:
    """A 2×H200 node as NVML described it (tests/fixtures/h200/recorded)."""
    return GpuFacts(
        gpus=[Gpu(i, "NVIDIA H200", 139.8, (9, 0)) for i in range(n)],
        driver="580.1",
        cuda_driver=(13, 0),
    )


@pytest.fixture
def gpus(monkeypatch):
    """Recorded GPU facts instead of this machine's, for the form and the gate."""

    def use(facts: GpuFacts) -> None:
        monkeypatch.setattr(ComposeScreen, "gpu_probe", staticmethod(lambda: facts))
        monkeypatch.setattr(PreflightScreen, "gpu_probe", staticmethod(lambda: facts))

    use(GpuFacts(error="no GPU (recorded)"))
    return use


async def settled(pilot, screen: ComposeScreen, timeout: float = 60.0):
    """The preview on screen is the one of the form as it is now."""
    await until(
        pilot,
        lambda: screen.preview is not None and not screen.preview_pending,
        timeout,
        "the preview",
    )


def demo_spec(**values) -> RunSpec:
    spec = load_spec(DEMO, ["train.max_steps=3"])
    return set_values(spec, values) if values else spec


async def type_into(pilot, screen, key: str, text: str) -> None:
    inp = screen.query_one("#" + widget_id(key), Input)
    inp.focus()
    inp.value = ""
    await pilot.press(*text) if text else await pilot.pause()


def shown(screen, key: str) -> bool:
    return screen.row(key).display


# -- the form and the preview --------------------------------------------------------------


async def test_every_option_has_a_field_and_edits_change_the_command(gpus):
    screen = ComposeScreen(demo_spec(), DEMO)
    async with screen_host(screen).run_test(size=(160, 48)) as pilot:
        await settled(pilot, screen)
        assert {r.option.key for r in screen.rows()} == set(OPTIONS)
        text = screen.preview_text()
        # the exact command, and for the built-in trainer the values it reads from spec.toml
        assert "-m torch.distributed.run" in text and "-m tunedeck.core.train" in text
        assert "--nproc_per_node 2" in text and "train.learning_rate = 0.005" in text
        assert "effective batch 8 = 4 per device x 2 data-parallel x 1 accumulation" in text
        await type_into(pilot, screen, "cluster.cpu_procs", "3")
        await type_into(pilot, screen, "train.learning_rate", "2e-4")
        await settled(pilot, screen)
        text = screen.preview_text()
        assert "--nproc_per_node 3" in text and "train.learning_rate = 0.0002" in text
        assert "effective batch 12 = 4 per device x 3 data-parallel" in text
        assert screen.spec.cluster.cpu_procs == 3 and screen.spec.train.learning_rate == 2e-4
        assert screen.row("train.learning_rate").has_class("-changed")


async def test_a_bad_value_shows_its_problem_under_the_field(gpus):
    screen = ComposeScreen(demo_spec(), DEMO)
    async with screen_host(screen).run_test(size=(160, 48)) as pilot:
        await settled(pilot, screen)
        await type_into(pilot, screen, "train.max_steps", "ten")
        row = screen.row("train.max_steps")
        assert row.has_class("-error")
        assert "train.max_steps must be int, got str 'ten'" in str(
            row.query_one(".field-error").render()
        )
        assert screen.spec.train.max_steps == 3  # the last good value stays
        await settled(pilot, screen)
        assert "✗ 1 problem(s): train.max_steps must be int" in screen.preview_text()
        # a problem blocks the launch and the save: the form would not be what runs
        await pilot.press("ctrl+l")
        await pilot.pause()
        assert not isinstance(pilot.app.screen, PreflightScreen)
        await type_into(pilot, screen, "train.max_steps", "0")
        assert "train.max_steps must be >= 1, got 0" in str(row.query_one(".field-error").render())
        await type_into(pilot, screen, "train.max_steps", "7")
        assert not row.has_class("-error") and screen.spec.train.max_steps == 7
        # a rule between keys lands under the key it names
        await type_into(pilot, screen, "data.path", "")
        data_row = screen.row("data.path")
        assert data_row.has_class(
            "-error"
        ) and "data.path is required for the builtin trainer" in str(
            data_row.query_one(".field-error").render()
        )
        choice = screen.query_one("#" + widget_id("parallel.strategy"), Select)
        assert [v for _, v in choice._options] == list(OPTIONS["parallel.strategy"].choices)


async def test_backend_and_strategy_decide_which_fields_show(gpus):
    screen = ComposeScreen(demo_spec(), DEMO)
    async with screen_host(screen).run_test(size=(160, 48)) as pilot:
        await settled(pilot, screen)
        assert shown(screen, "train.max_steps") and shown(screen, "data.skip_bad_rows")
        assert not shown(screen, "swift.command") and not shown(screen, "script.path")
        assert not shown(screen, "parallel.zero_stage") and not shown(screen, "parallel.tp")
        assert not shown(screen, "cluster.node_rank")
        sel = lambda key: screen.query_one("#" + widget_id(key), Select)  # noqa: E731
        sel("backend").value = "swift"
        await pilot.pause()
        assert shown(screen, "swift.command") and shown(screen, "swift.extra_args")
        assert not shown(screen, "data.skip_bad_rows") and not shown(screen, "method.merge_lora")
        sel("parallel.strategy").value = "deepspeed"
        await pilot.pause()
        assert shown(screen, "parallel.zero_stage") and shown(screen, "parallel.zero_offload")
        assert not shown(screen, "parallel.cpu_offload")
        sel("parallel.strategy").value = "fsdp2"
        await pilot.pause()
        assert shown(screen, "parallel.cpu_offload") and not shown(screen, "parallel.zero_stage")
        sel("method.type").value = "full"
        await pilot.pause()
        assert not shown(screen, "method.lora_rank") and not shown(screen, "method.quant_bits")
        sel("method.type").value = "qlora"
        await pilot.pause()
        assert shown(screen, "method.quant_bits") and shown(screen, "method.lora_rank")
        await type_into(pilot, screen, "cluster.nnodes", "2")
        assert shown(screen, "cluster.node_rank") and shown(screen, "cluster.join_timeout_s")
        sel("backend").value = "script"
        await pilot.pause()
        assert shown(screen, "script.path") and not shown(screen, "train.max_steps")
        assert not shown(screen, "parallel.strategy")
        # a section with nothing that applies has no header
        assert not screen.query_one("#s-training").display
        assert screen.query_one("#s-cluster").display


async def test_save_writes_a_toml_that_loads_back_equal(gpus, tmp_path):
    screen = ComposeScreen(demo_spec(**{"env.HF_TOKEN": "hf_secret_value"}), DEMO)
    async with screen_host(screen).run_test(size=(160, 48)) as pilot:
        await settled(pilot, screen)
        # the secret is masked in the form and in the preview, and survives an edit there
        env = screen.query_one("#" + widget_id("env"), Input)
        assert env.value == "HF_TOKEN=****"
        assert "hf_secret_value" not in screen.preview_text()
        assert "HF_TOKEN='****'" in screen.preview_text()
        await type_into(pilot, screen, "env", "HF_TOKEN=**** NCCL_DEBUG=INFO")
        assert screen.spec.env == {"HF_TOKEN": "hf_secret_value", "NCCL_DEBUG": "INFO"}
        await type_into(pilot, screen, "train.max_steps", "42")
        await type_into(pilot, screen, "method.target_modules", "q_proj v_proj")
        await pilot.press("ctrl+s")
        await until(pilot, lambda: isinstance(pilot.app.screen, PromptScreen), what="prompt")
        target = tmp_path / "nested" / "mine.toml"
        pilot.app.screen.query_one(Input).value = str(target)
        await pilot.press("enter")
        await until(pilot, lambda: target.exists() and screen.path == target, what="the save")
        text = target.read_text()
        assert "hf_secret_value" not in text and "not saved, secrets: HF_TOKEN" in text
        back = load_spec(target)
        expected = set_values(screen.spec, {"env.HF_TOKEN": None})
        assert back == expected
        assert back.train.max_steps == 42 and back.method.target_modules == ["q_proj", "v_proj"]
        assert not screen.dirty


async def test_save_asks_before_replacing_a_preset_or_a_file_and_esc_before_discarding(
    gpus, tmp_path
):
    from tunedeck.tui.screens.confirm import ConfirmScreen

    shipped = DEMO.read_text()
    home = Path.home()  # the suite's private home (conftest), never the user's
    proposal = home / "demo.toml"
    proposal.unlink(missing_ok=True)
    screen = ComposeScreen(demo_spec(), DEMO)
    async with screen_host(screen).run_test(size=(120, 40)) as pilot:
        app = pilot.app
        await settled(pilot, screen)

        async def save_as(path: Path | None = None) -> str:
            """ctrl+s, accept (or type) the path; what the prompt proposed."""
            await pilot.press("ctrl+s")
            await until(pilot, lambda: isinstance(app.screen, PromptScreen), what="prompt")
            inp = app.screen.query_one(Input)
            proposed = inp.value
            if path is not None:
                inp.value = str(path)
            await pilot.press("enter")
            return proposed

        # a shipped preset: the proposal is in the user's home, not the package's presets
        assert await save_as() == str(proposal)
        await until(pilot, lambda: proposal.exists(), what="the save in the home")
        assert DEMO.read_text() == shipped
        # asked to write over the shipped preset: a confirmation naming it; n keeps it
        await type_into(pilot, screen, "train.max_steps", "7")
        await save_as(DEMO)
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirmation")
        question = str(app.screen.query_one("#confirm-question").render())
        assert str(DEMO) in question and "preset shipped with tunedeck" in question
        await pilot.press("n")
        await until(pilot, lambda: app.screen is screen, what="back to the form")
        assert DEMO.read_text() == shipped and screen.dirty
        # an existing file of the user's: asked too; y replaces it
        mine = tmp_path / "mine.toml"
        mine.write_text("# mine\n")
        await save_as(mine)
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirmation")
        assert str(mine) in str(app.screen.query_one("#confirm-question").render())
        await pilot.press("y")
        await until(pilot, lambda: screen.path == mine and not screen.dirty, what="overwrite")
        assert load_spec(mine).train.max_steps == 7
        # elsewhere the data path is absolute (it must still find the data); inside the
        # file's folder it is written relative, as a preset has it
        assert f'path = "{DEMO_DATA}"' in mine.read_text()
        (tmp_path / "data").mkdir()
        (tmp_path / "data" / "demo_chat.jsonl").write_text(DEMO_DATA.read_text())
        screen.spec.data.path = str(tmp_path / "data" / "demo_chat.jsonl")
        beside = tmp_path / "beside.toml"
        await save_as(beside)
        await until(pilot, lambda: screen.path == beside, what="the save beside")
        assert 'path = "data/demo_chat.jsonl"' in beside.read_text()
        assert load_spec(beside).data.path == str(tmp_path / "data" / "demo_chat.jsonl")

        # Esc on an edited form asks; n stays, y leaves
        await type_into(pilot, screen, "train.max_steps", "9")
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="discard?")
        assert "Discard the changes" in str(app.screen.query_one("#confirm-question").render())
        await pilot.press("n")
        await until(pilot, lambda: app.screen is screen, what="still in the form")
        assert screen.spec.train.max_steps == 9
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="discard?")
        await pilot.press("y")
        await until(pilot, lambda: screen not in app.screen_stack, what="the form left")

    # an imported spec (no file behind it) asks before it is dropped, unedited as it is
    screen = ComposeScreen(demo_spec(), title="imported command")
    async with screen_host(screen).run_test(size=(120, 40)) as pilot:
        await settled(pilot, screen)
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen), what="ask")
        assert "unsaved spec" in str(pilot.app.screen.query_one("#confirm-question").render())
    # a file opened and left unedited leaves at once
    screen = ComposeScreen(demo_spec(), DEMO)
    async with screen_host(screen).run_test(size=(120, 40)) as pilot:
        await settled(pilot, screen)
        await pilot.press("escape")
        await until(pilot, lambda: screen not in pilot.app.screen_stack, what="left at once")


async def test_port_is_picked_once_and_kept_for_the_launch(gpus):
    spec = demo_spec()
    assert spec.cluster.master_port == 0
    screen = ComposeScreen(spec, DEMO)
    async with screen_host(screen).run_test(size=(160, 48)) as pilot:
        await settled(pilot, screen)
        port = screen.port
        assert port and f"--master_port {port}" in screen.preview_text()
        assert f"port {port} (picked now" in screen.preview_text()
        await type_into(pilot, screen, "train.max_steps", "5")
        await settled(pilot, screen)
        assert f"--master_port {port}" in screen.preview_text()
        await pilot.press("ctrl+l")
        await until(pilot, lambda: isinstance(pilot.app.screen, PreflightScreen), what="gate")
        assert pilot.app.screen.spec.cluster.master_port == port
        assert screen.spec.cluster.master_port == 0  # the form keeps "pick at launch"
        await pilot.press("escape")
        await until(pilot, lambda: pilot.app.screen is screen, what="back")
        await type_into(pilot, screen, "cluster.master_port", "29555")
        await settled(pilot, screen)
        assert "port 29555 (cluster.master_port)" in screen.preview_text()


async def test_estimate_turns_red_past_capacity_and_the_advice_is_one_key_away(gpus, tmp_path):
    big = tmp_path / "qwen7b"
    big.mkdir()
    (big / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "hidden_size": 3584,
                "num_hidden_layers": 28,
                "num_attention_heads": 28,
                "num_key_value_heads": 4,
                "intermediate_size": 18944,
                "vocab_size": 152064,
                "tie_word_embeddings": False,
            }
        )
    )
    # two 24 GiB GPUs, as a fake NVML reports them through the real probe
    gpus(probe_gpus(FakePynvml(2, name="NVIDIA A10G", total_mib=24576, cc=(8, 6))))
    # batch 8: the built-in trainer's chunked loss and fused LoRA layers let batches up to 6
    # fit one 24 GiB GPU with gradient checkpointing; 8 needs FSDP2 over both
    spec = demo_spec(
        **{
            "model.path": str(big),
            "data.max_length": 2048,
            "train.per_device_batch_size": 8,
            "cluster.device": "cuda",
        }
    )
    screen = ComposeScreen(spec, DEMO)
    async with screen_host(screen).run_test(size=(160, 48)) as pilot:
        await settled(pilot, screen)
        text = screen.preview_text()
        assert screen.preview.fit == "fail", text
        assert "GPU0 NVIDIA A10G 24.0 GiB: will not fit" in text
        assert "GPU1 NVIDIA A10G 24.0 GiB: will not fit" in text
        assert "✗ will not fit in GPU memory" in text
        await pilot.press("ctrl+t")
        await until(pilot, lambda: isinstance(pilot.app.screen, AdviceScreen), what="advice")
        advice = str(pilot.app.screen.query_one("#advice-text").render())
        assert "advice: fsdp2 on 2 GPU(s)" in advice, advice
        await pilot.press("a")
        await until(pilot, lambda: pilot.app.screen is screen, what="back")
        assert screen.spec.parallel.strategy == "fsdp2"
        assert screen.spec.train.gradient_checkpointing
        assert screen.query_one("#" + widget_id("parallel.strategy"), Select).value == "fsdp2"
        await settled(pilot, screen)
        assert "--nproc_per_node 2" in screen.preview_text()
    # the same spec on H200s fits
    gpus(h200s())
    screen = ComposeScreen(spec, DEMO)
    async with screen_host(screen).run_test(size=(160, 48)) as pilot:
        await settled(pilot, screen)
        assert screen.preview.fit == "pass"
        assert "GPU1 NVIDIA H200 139.8 GiB: fits" in screen.preview_text()


@pytest.mark.skipif(
    not __import__("importlib.util").util.find_spec("swift"), reason="ms-swift not installed"
)
async def test_swift_preview_follows_without_importing_ms_swift(gpus):
    spec = load_spec(REPO / "presets" / "swift-ddp-lora-2gpu.toml")
    gpus(h200s())
    screen = ComposeScreen(spec)
    async with screen_host(screen).run_test(size=(160, 48)) as pilot:
        await settled(pilot, screen, timeout=240)
        text = screen.preview_text()
        assert "-m swift.cli.sft" in text and "--tuner_type lora" in text, text
        # each setting with its value and whose it is: unset keys are ms-swift's defaults
        assert "ms-swift settings" in text
        assert re.search(
            r"--lora_dropout 0\.05 +\(method\.lora_dropout: ms-swift [\d.]+ "
            r"default\)",
            text,
        ), text
        await type_into(pilot, screen, "method.lora_rank", "32")
        await settled(pilot, screen)
        assert "--lora_rank 32" in screen.preview_text()
        assert "--lora_rank 32  (method.lora_rank: spec)" in screen.preview_text()
        # flags were checked by ms-swift's own parser, in a child process
        await type_into(pilot, screen, "swift.extra_args", "--no_such_flag 1")
        await settled(pilot, screen)
        assert "cannot run: ms-swift would reject this run" in screen.preview_text()
        assert "--no_such_flag" in screen.preview_text()
    assert "swift" not in sys.modules


async def test_new_run_starts_from_a_preset(gpus):
    screen = ComposeScreen()
    async with screen_host(screen).run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: isinstance(pilot.app.screen, PresetPicker), what="picker")
        picker = pilot.app.screen
        table = picker.query_one(DataTable)
        await until(pilot, lambda: table.row_count > 0, what="presets")
        names = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        table.move_cursor(row=names.index("demo"))
        await pilot.press("enter")
        await until(pilot, lambda: pilot.app.screen is screen, what="the form")
        assert screen.spec == load_spec(DEMO) and screen.path == DEMO
        assert screen.query_one("#" + widget_id("name"), Input).value == "demo"
        await settled(pilot, screen)
        assert "-m tunedeck.core.train" in screen.preview_text()
        # esc on the picker keeps a blank spec
        await pilot.press("ctrl+o")
        await until(pilot, lambda: isinstance(pilot.app.screen, PresetPicker), what="picker")
        await pilot.press("escape")
        await until(pilot, lambda: pilot.app.screen is screen, what="the form")
        assert screen.spec.name == "demo"


async def test_open_a_spec_file_by_path_and_readonly_hides_launch_and_save(gpus, tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text(f'name = "mine"\n[data]\npath = "{DEMO_DATA}"\n[train]\nmax_steps = 9\n')
    screen = ComposeScreen(path=f)
    async with screen_host(screen, readonly=True).run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: screen.spec.name == "mine", what="the file")
        assert screen.spec.train.max_steps == 9
        assert screen.check_action("launch", ()) is False
        assert screen.check_action("save", ()) is False
        await pilot.press("ctrl+l", "ctrl+s")
        await pilot.pause()
        assert pilot.app.screen is screen
        assert "launch" not in {a for _, _, a in screen.commands()}


async def test_stale_previews_are_dropped_and_the_last_edit_wins(gpus):
    from rich.text import Text

    from tunedeck.tui.screens.compose import PreviewData, PreviewReady

    screen = ComposeScreen(demo_spec(), DEMO)
    async with screen_host(screen).run_test(size=(160, 48)) as pilot:
        await settled(pilot, screen)
        before = len(screen.latencies)
        inp = screen.query_one("#" + widget_id("cluster.cpu_procs"), Input)
        for text in ("1", "12", "123", "1000", "1024"):  # faster than the debounce
            inp.value = text
        await pilot.pause()  # the Changed events reach the screen
        await settled(pilot, screen)
        assert "--nproc_per_node 1024" in screen.preview_text()
        assert len(screen.latencies) - before <= 2  # the first at once, the rest as one
        # an answer to an older edit that arrives late is dropped
        old = PreviewData(Text("stale"), Text("stale"), "pass")
        screen.post_message(PreviewReady(screen.generation - 1, time.perf_counter(), old))
        await pilot.pause(0.1)
        assert "stale" not in screen.preview_text()


# -- snapshots (fixed spec, port, paths and recorded GPUs) ------------------------------------


def _snapshot_app(monkeypatch) -> App:
    monkeypatch.setenv("TUNEDECK_HOME", "/srv/tunedeck")
    monkeypatch.setattr(sys, "executable", "/usr/bin/python3")
    monkeypatch.setattr(ComposeScreen, "gpu_probe", staticmethod(h200s))
    spec = RunSpec(name="snap")
    spec = set_values(
        spec,
        {
            "data.path": "/data/chat.jsonl",
            "cluster.master_port": 29500,
            "method.lora_rank": 16,
            "train.max_steps": 300,
            "train.learning_rate": 2e-4,
            "train.save_steps": 100,
        },
    )
    return screen_host(ComposeScreen(spec, title="snap"))


async def _wait_preview(pilot) -> None:
    screen = pilot.app.screen
    for inp in screen.query(Input):  # a blinking cursor would make the picture a coin toss
        inp.cursor_blink = False
    await settled(pilot, screen)
    await pilot.pause(0.1)


@pytest.mark.parametrize("size", [(80, 24), (160, 48), (120, 40), (240, 67)])
def test_compose_snapshot(snap_compare, monkeypatch, size):
    assert snap_compare(_snapshot_app(monkeypatch), terminal_size=size, run_before=_wait_preview)


def test_build_preview_runs_without_a_screen():
    """What the worker runs needs no UI (the latency benchmark times it alone too)."""
    from tunedeck.tui.screens.compose import build_preview

    spec = set_values(demo_spec(), {"cluster.master_port": 29500})
    data = build_preview(spec, h200s())
    assert not data.error and "--master_port 29500" in data.body.plain
    assert Path(DEMO).exists()


async def test_go_to_a_field_by_its_key(gpus):
    """ctrl+g: a form of ~60 fields is reached by key, the full one or its last word."""
    screen = ComposeScreen(spec=demo_spec())
    async with screen_host(screen).run_test(size=(120, 40)) as pilot:
        await settled(pilot, screen)
        for typed, key in (
            ("max_steps", "train.max_steps"),
            ("cluster.master_port", "cluster.master_port"),
        ):
            await pilot.press("ctrl+g")
            await until(pilot, lambda: isinstance(pilot.app.screen, PromptScreen), what="prompt")
            await pilot.press(*typed, "enter")
            await until(pilot, lambda: pilot.app.screen is screen, what="the form")
            await pilot.pause()
            assert screen.focused is screen.query_one("#" + widget_id(key))
        await pilot.press("ctrl+u", *"9", "tab")
        await until(pilot, lambda: screen.spec.cluster.master_port == 9, what="the edit")


async def test_a_value_put_in_the_form_leaves_the_cursor_at_its_end(gpus, tmp_path):
    """A spec loaded into the form (a preset, a file): ctrl+u then clears the whole field,
    not all but the tail of the new value."""
    screen = ComposeScreen()  # name "run" typed-in state, then the preset arrives
    async with screen_host(screen).run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: isinstance(pilot.app.screen, PresetPicker), what="picker")
        picker = pilot.app.screen
        table = picker.query_one(DataTable)
        await until(pilot, lambda: table.row_count > 0, what="presets")
        names = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        table.move_cursor(row=names.index("demo"))
        await pilot.press("enter")
        await until(pilot, lambda: screen.spec.name == "demo", what="the preset")
        name = screen.query_one("#" + widget_id("name"), Input)
        name.focus()
        await pilot.press("ctrl+u", *"e2e")
        await until(pilot, lambda: screen.spec.name == "e2e", what="the new name")


@pytest.mark.skipif(
    not __import__("importlib.util").util.find_spec("swift"), reason="ms-swift not installed"
)
async def test_an_unset_ms_swift_key_shows_ms_swifts_value_dim_and_stays_unset(gpus, tmp_path):
    """A key an ms-swift spec leaves unset passes no flag: its box is empty, with the value
    ms-swift will use as the placeholder (not as a value); typing sets it (its flag appears),
    emptying the box unsets it again. The memory line is the one `tunedeck estimate` prints."""
    from tunedeck.core.estimate import QWEN25

    m = tmp_path / "m"
    m.mkdir()
    (m / "config.json").write_text(json.dumps(QWEN25["7b"]))
    spec = load_spec(REPO / "presets" / "swift-ddp-lora-2gpu.toml")
    spec = set_values(spec, {"model.path": str(m)})
    for key in (
        "train.per_device_batch_size",
        "data.max_length",
        "method.lora_rank",
        "train.gradient_checkpointing",
    ):
        spec = set_values(spec, {key: OPTIONS[key].default})
        spec.explicit.discard(key)
    gpus(h200s())
    screen = ComposeScreen(spec)
    box = lambda key: screen.query_one("#" + widget_id(key), Input)  # noqa: E731
    async with screen_host(screen).run_test(size=(160, 48)) as pilot:
        await settled(pilot, screen, timeout=240)
        batch = box("train.per_device_batch_size")
        assert batch.value == "" and re.match(r"1 · ms-swift [\d.]+ default", batch.placeholder)
        assert box("method.lora_rank").placeholder.startswith("8 · ms-swift")
        assert re.match(
            r"32768 · ms-swift [\d.]+ default: the model's length limit",
            box("data.max_length").placeholder,
        )
        # the settings pane says the same, not "decided at run time"
        assert re.search(
            r"--max_length 32768  \(data\.max_length: ms-swift [\d.]+ default: "
            "the model's length limit",
            screen.preview_text(),
        )
        gc = screen.query_one("#" + widget_id("train.gradient_checkpointing"), Select)
        assert gc.value is Select.NULL and gc.prompt.startswith("true · ms-swift")
        assert box("data.path").placeholder == ""  # a key with a value says nothing
        assert "effective batch 16 = 1 per device x 2" in screen.preview_text()
        unset_row = "--per_device_train_batch_size 1  (train.per_device_batch_size: ms-swift"
        # ctrl+t gives the advice `tunedeck estimate` prints, ms-swift's speed flags with it
        await pilot.press("ctrl+t")
        await until(pilot, lambda: isinstance(pilot.app.screen, AdviceScreen), what="advice")
        advice = str(pilot.app.screen.query_one("#advice-text").render())
        assert "faster with the installed ms-swift" in advice and "--use_liger_kernel" in advice
        await pilot.press("escape")
        await until(pilot, lambda: pilot.app.screen is screen, what="back")
        assert unset_row in screen.preview_text()
        await type_into(pilot, screen, "train.per_device_batch_size", "4")
        await settled(pilot, screen)
        assert (
            "--per_device_train_batch_size 4  (train.per_device_batch_size: spec)"
            in screen.preview_text()
        )
        await type_into(pilot, screen, "train.per_device_batch_size", "")
        await settled(pilot, screen)
        assert unset_row in screen.preview_text()
        assert "--per_device_train_batch_size 4" not in screen.preview_text()
        assert not screen.field_errors and "train.per_device_batch_size" not in screen.spec.explicit
        gc.value = False
        await pilot.pause()
        await settled(pilot, screen)
        assert "--gradient_checkpointing false" in screen.preview_text()


async def test_choosing_false_in_a_yes_no_field_sets_it(gpus):
    """`false` is a choice like any other (it was once taken for "nothing chosen")."""
    screen = ComposeScreen(demo_spec(**{"train.gradient_checkpointing": True}), DEMO)
    async with screen_host(screen).run_test(size=(160, 48)) as pilot:
        await settled(pilot, screen)
        screen.query_one("#" + widget_id("train.gradient_checkpointing"), Select).value = False
        await pilot.pause()
        await settled(pilot, screen)
        assert screen.spec.train.gradient_checkpointing is False
        assert "train.gradient_checkpointing = false" in screen.preview_text()


async def test_the_token_lengths_of_the_data_show_and_follow_max_length(gpus, model_cache):
    """The side pane measures data.path with the model's tokenizer (a histogram whose counts
    add up to the rows, percentiles, what data.max_length cuts, the advice) and follows an
    edit of data.max_length without tokenizing again."""
    from tunedeck.core.modelout import base_model_path
    from tunedeck.core.preflight import inputs

    spec = demo_spec()
    base_model_path(spec)  # the demo's tokenizer exists (built once per test session)
    screen = ComposeScreen(spec, DEMO)
    async with screen_host(screen).run_test(size=(160, 48)) as pilot:
        await settled(pilot, screen)
        text = screen.preview_text()
        m = re.search(r"(\d+) rows: p50 (\d+), p90 (\d+), p99 (\d+), max (\d+) tokens", text)
        assert m, text
        rows, p50, p90, p99, top = map(int, m.groups())
        assert rows == sum(1 for line in DEMO_DATA.read_text().splitlines() if line.strip())
        assert 0 < p50 <= p90 <= p99 <= top
        bars = re.findall(r"≤\s*(\d+) [█ ]* (\d+)\n", text)
        assert sum(int(c) for _, c in bars) == rows and int(bars[-1][0]) >= top
        assert f"none over data.max_length {spec.data.max_length}" in text
        tokenized = inputs._sample_lengths.cache_info().misses
        await type_into(pilot, screen, "data.max_length", str(p50))
        await settled(pilot, screen)
        text = screen.preview_text()
        cut = re.search(
            r"; ([\d.]+)% of samples \(([\d.]+)% of tokens\) over data.max_length", text
        )
        assert cut and 0 < float(cut.group(1)) <= 50, text
        assert re.search(r"consider data.max_length=\d+ holds 99 % of the samples", text)
        assert inputs._sample_lengths.cache_info().misses == tokenized  # not measured again
