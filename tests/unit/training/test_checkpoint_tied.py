"""Tied weights in a checkpoint: stored once, restored under both names."""

import torch

from eft.training import checkpoint


class _State:
    """What `checkpoint.save` asks of a strategy (pure logic: no model needed)."""

    def __init__(self, state):
        self.state, self.loaded = state, None

    def trainable_state(self):
        return self.state

    def optimizer_state(self):
        return {}

    def load_trainable_state(self, state):
        self.loaded = state

    def load_optimizer_state(self, state):
        pass


def test_tied_embedding_and_head_round_trip(tmp_path):
    embedding = torch.randn(10, 4)
    state = {"model.embed_tokens.weight": embedding, "lm_head.weight": embedding,
             "model.norm.weight": torch.ones(4)}
    checkpoint.save(tmp_path, _State(state), rank=0, step=3, world_size=1, reason="interval", metrics={})
    kept, aliases = checkpoint.split_shared(state)
    assert aliases == {"lm_head.weight": "model.embed_tokens.weight"} and len(kept) == 2
    target = _State({})
    assert checkpoint.restore(tmp_path, target)["step"] == 3
    assert set(target.loaded) == set(state)
    assert torch.equal(target.loaded["lm_head.weight"], embedding)


def test_views_of_different_parts_of_one_storage_are_not_aliases():
    flat = torch.randn(8)
    kept, aliases = checkpoint.split_shared({"a": flat[:4], "b": flat[4:]})
    assert aliases == {} and set(kept) == {"a", "b"}


class _Planted:
    """What an attacker with write access to the checkpoint store would put in optimizer.pt."""

    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path('PWNED').write_text('ran')",))


def test_a_checkpoint_is_read_back_without_running_pickled_code(tmp_path, monkeypatch):
    import pickle

    import pytest

    monkeypatch.chdir(tmp_path)
    directory = tmp_path / "ckpt"
    checkpoint.save(directory, _State({"w": torch.ones(2)}), rank=0, step=1, world_size=1, reason="interval", metrics={})
    torch.save({"state": {0: {"step": torch.tensor(1.0)}}, "planted": _Planted()}, directory / checkpoint.OPTIMIZER_FILE)
    with pytest.raises(pickle.UnpicklingError):
        checkpoint.restore(directory, _State({}))
    assert not (tmp_path / "PWNED").exists()
    # A real optimizer's state (tensors, numbers, tuples, None) loads.
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    torch.save(optimizer.state_dict(), directory / checkpoint.OPTIMIZER_FILE)
    loaded = []
    state = _State({})
    state.load_optimizer_state = loaded.append
    checkpoint.restore(directory, state)
    assert loaded[0]["param_groups"][0]["betas"] == (0.9, 0.999)
