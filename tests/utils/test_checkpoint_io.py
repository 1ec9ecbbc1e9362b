"""Checkpoints written in the background: the caller does not wait for the write, the file holds
the state as it was when saved (not as the next optimizer step left it), a removal or a link
waits for the writes before it, teardown waits for every write, and a real run's last.ckpt is
its final state."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from lightning.fabric.plugins import TorchCheckpointIO

from volseg.utils.checkpoint_io import TMP_SUFFIX, BackgroundCheckpointIO, host_snapshot

GATE_TIMEOUT_S = 30


class GatedIO(TorchCheckpointIO):
    """Lightning's own file writer, started only once the test opens the gate (a slow disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.started = threading.Event()

    def save_checkpoint(self, *args, **kwargs) -> None:
        self.started.set()
        assert self.gate.wait(GATE_TIMEOUT_S), "the test never opened the gate"
        super().save_checkpoint(*args, **kwargs)


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    return model, optimizer


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad()
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()  # changes weights and AdamW's moments in place


def test_save_returns_before_the_write_and_the_file_holds_the_state_at_save(tmp_path: Path):
    model, optimizer = _model_and_optimizer()
    saved = {
        "state_dict": {k: v.clone() for k, v in model.state_dict().items()},
        "optimizer": {k: v["exp_avg"].clone() for k, v in optimizer.state_dict()["state"].items()},
    }
    inner = GatedIO()
    io = BackgroundCheckpointIO(inner)
    path = tmp_path / "last.ckpt"
    checkpoint = {"state_dict": model.state_dict(), "optimizer": optimizer.state_dict()}
    checkpoint["progress"] = {"seen": [1, 2]}
    io.save_checkpoint(checkpoint, path)
    # the writer is held at the gate: had save waited for the write, it would not be here yet
    assert inner.started.wait(GATE_TIMEOUT_S)
    assert not path.exists()
    _step(model, optimizer)  # the next optimizer step, while the file is being written
    checkpoint["progress"]["seen"].append(3)  # state kept in a list, updated in place
    assert not torch.equal(model.weight, saved["state_dict"]["weight"])
    inner.gate.set()
    io.teardown()  # waits for the write

    written = torch.load(path, weights_only=True)
    for key, value in saved["state_dict"].items():
        assert torch.equal(written["state_dict"][key], value), key
    for key, value in saved["optimizer"].items():
        assert torch.equal(written["optimizer"]["state"][key]["exp_avg"], value), key
    assert written["progress"]["seen"] == [1, 2]
    assert not (tmp_path / f"last.ckpt{TMP_SUFFIX}").exists()


def test_removing_the_previous_best_waits_for_the_new_one(tmp_path: Path):
    """ModelCheckpoint saves the new best, then removes the previous one: the removal must not
    run before the new file is whole, or a kill in between leaves no best checkpoint."""
    previous, new = tmp_path / "epoch_001.ckpt", tmp_path / "epoch_003.ckpt"
    torch.save({"epoch": 1}, previous)
    inner = GatedIO()
    io = BackgroundCheckpointIO(inner)
    io.save_checkpoint({"epoch": 3}, new)
    io.remove_checkpoint(previous)
    assert inner.started.wait(GATE_TIMEOUT_S)
    assert previous.exists() and not new.exists()
    inner.gate.set()
    io.teardown()
    assert torch.load(new, weights_only=True) == {"epoch": 3}
    assert not previous.exists()


def test_a_link_waits_for_its_file_and_outlives_it(tmp_path: Path):
    """last.ckpt as a second name of the best checkpoint saved at the same step: made once the
    best is written (not before: there is no file yet), and still whole when the best is
    removed (a later best replaces it) or last.ckpt is written anew."""
    best, last = tmp_path / "epoch_003.ckpt", tmp_path / "last.ckpt"
    torch.save({"epoch": 1}, last)
    inner = GatedIO()
    io = BackgroundCheckpointIO(inner)
    io.save_checkpoint({"epoch": 3}, best)
    io.link_checkpoint(str(best), str(last))  # returns at once: the writer is at the gate
    assert inner.started.wait(GATE_TIMEOUT_S)
    assert torch.load(last, weights_only=True) == {"epoch": 1}
    inner.gate.set()
    io.remove_checkpoint(best)
    io.teardown()
    assert not best.exists() and not Path(str(last) + TMP_SUFFIX).exists()
    assert torch.load(last, weights_only=True) == {"epoch": 3}
    assert io.writes == 1 and io.links == 1


def test_a_link_is_a_copy_where_the_file_system_has_no_hard_links(tmp_path: Path, monkeypatch):
    import os

    def no_links(*args):
        raise OSError("hard links not supported")

    best, last = tmp_path / "epoch_003.ckpt", tmp_path / "last.ckpt"
    torch.save({"epoch": 3}, best)
    monkeypatch.setattr(os, "link", no_links)
    io = BackgroundCheckpointIO(TorchCheckpointIO())
    io.link_checkpoint(str(best), str(last))
    io.teardown()
    assert not os.path.samefile(best, last)
    assert torch.load(last, weights_only=True) == {"epoch": 3}


def test_a_failed_write_is_raised_at_teardown(tmp_path: Path):
    io = BackgroundCheckpointIO(TorchCheckpointIO())
    io.save_checkpoint({"x": torch.zeros(1)}, tmp_path / "a.ckpt")
    (tmp_path / "blocks").write_text("a file where a folder should be")
    io.save_checkpoint({"x": torch.zeros(1)}, tmp_path / "blocks" / "b.ckpt")
    with pytest.raises(Exception, match="blocks"):
        io.teardown()


def test_host_snapshot_shares_no_tensor_and_no_container():
    tensor = torch.arange(4.0)
    checkpoint = {"a": tensor, "nested": [tensor, {"n": 1}], "state": {"rng": [1, 2]}}
    snap, _ = host_snapshot(checkpoint)
    tensor.add_(10)
    checkpoint["state"]["rng"].append(3)
    assert torch.equal(snap["a"], torch.arange(4.0))
    assert torch.equal(snap["nested"][0], torch.arange(4.0))
    assert snap["state"]["rng"] == [1, 2]


def test_a_save_after_a_finished_write_reuses_its_host_memory_and_writes_the_new_state(
    tmp_path: Path,
):
    """The second save copies into the host tensors of the first (written by then), and each
    file holds the state at its own save; while a write is in flight its tensors are not
    reused (the third save, made with the second still gated, gets memory of its own)."""
    model, optimizer = _model_and_optimizer()
    inner = GatedIO()
    inner.gate.set()
    io = BackgroundCheckpointIO(inner)
    host_copies: list[list[torch.Tensor]] = []
    write = io._write

    def recording_write(checkpoint, taken, *args):
        host_copies.append(list(taken))
        write(checkpoint, taken, *args)

    io._write = recording_write
    states = []
    for name in ("first", "second"):
        states.append({k: v.clone() for k, v in model.state_dict().items()})
        io.save_checkpoint({"state_dict": model.state_dict()}, tmp_path / f"{name}.ckpt")
        io._wait_for_writes(0)
        _step(model, optimizer)
    inner.gate.clear()
    io.save_checkpoint({"state_dict": model.state_dict()}, tmp_path / "third.ckpt")
    assert inner.started.wait(GATE_TIMEOUT_S)
    io.save_checkpoint({"state_dict": model.state_dict()}, tmp_path / "fourth.ckpt")
    inner.gate.set()
    io.teardown()

    pointers = [{t.data_ptr() for t in copies} for copies in host_copies]
    assert len(pointers[0]) == len(model.state_dict())
    assert pointers[1] == pointers[0], "the second save did not reuse the first's host memory"
    assert not pointers[3] & pointers[2], "a save reused memory of a write still in flight"
    for name, state in zip(("first", "second"), states, strict=True):
        written = torch.load(tmp_path / f"{name}.ckpt", weights_only=True)["state_dict"]
        for key, value in state.items():
            assert torch.equal(written[key], value), (name, key)


def test_a_run_writes_in_the_background_and_its_last_ckpt_is_its_final_state(
    small_dataset, tmp_path
):
    """The default (``async_checkpoint=auto`` on one process) trains with the background writer;
    after fit (whose teardown waits for the writes) last.ckpt and the best checkpoint are whole
    files and last.ckpt holds the trained weights exactly."""
    from tests.conftest import compose_config, tiny_train_overrides
    from volseg.tasks import train as train_task

    overrides = [
        *tiny_train_overrides(small_dataset),
        "trainer.max_epochs=1",
        "callbacks.validation_overlays=null",
        "callbacks.early_stopping=null",
    ]
    train_cfg = compose_config("train", tmp_path / "run", overrides)

    built = []
    build_trainer = train_task.build_trainer
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            train_task,
            "build_trainer",
            lambda *a, **k: built.append(build_trainer(*a, **k)) or built[-1],
        )
        train_task.train(train_cfg)
    trainer = built[0]
    io = trainer.strategy.checkpoint_io
    assert isinstance(io, BackgroundCheckpointIO)
    assert io.written_seconds > 0  # the writer thread wrote them
    folder = Path(train_cfg.paths.output_dir) / "checkpoints"
    assert not list(folder.glob(f"*{TMP_SUFFIX}"))
    best = Path(trainer.checkpoint_callback.best_model_path)
    assert best.parent == folder and best.exists()
    last = torch.load(folder / "last.ckpt", weights_only=True)
    assert last["global_step"] == trainer.global_step
    for key, value in trainer.lightning_module.state_dict().items():
        assert torch.equal(last["state_dict"][key], value.cpu()), key


def test_two_writes_in_flight_a_third_save_waits_for_the_oldest(tmp_path: Path):
    """The best checkpoint and last.ckpt saved after one validation: the second does not wait
    for the first; a third save waits (host memory holds at most two copies)."""
    inner = GatedIO()
    io = BackgroundCheckpointIO(inner)
    io.save_checkpoint({"n": 1}, tmp_path / "best.ckpt")
    io.remove_checkpoint(tmp_path / "previous_best.ckpt")  # a removal holds no copy
    io.save_checkpoint({"n": 2}, tmp_path / "last.ckpt")  # returns: the gate is still closed
    third = threading.Thread(target=io.save_checkpoint, args=({"n": 3}, tmp_path / "last.ckpt"))
    third.start()
    third.join(timeout=0.5)
    assert third.is_alive(), "a third save did not wait for the oldest write"
    inner.gate.set()
    third.join(timeout=GATE_TIMEOUT_S)
    assert not third.is_alive()
    io.teardown()
    assert torch.load(tmp_path / "best.ckpt", weights_only=True) == {"n": 1}
    assert torch.load(tmp_path / "last.ckpt", weights_only=True) == {"n": 3}
