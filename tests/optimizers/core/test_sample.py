"""TrainingSample: defaults and the validation of every per-token list."""

from __future__ import annotations

import pytest

from rolecall.optimizers.core import TrainingSample

BASE = {"role": "plan", "adapter": "plan", "prompt_ids": [1, 2], "completion_ids": [3, 4, 5]}


def test_defaults_fill_an_all_ones_mask_and_zero_advantages():
    s = TrainingSample(**BASE)
    assert s.loss_mask == [1, 1, 1] and s.num_loss_tokens == 3 and s.num_tokens == 5
    assert s.per_token_advantages() == [0.0, 0.0, 0.0]
    assert TrainingSample(**BASE, advantage=2).per_token_advantages() == [2.0, 2.0, 2.0]
    assert TrainingSample(**BASE, token_advantages=[1, 2, 3]).per_token_advantages() == [1.0, 2.0, 3.0]


def test_dpo_sample_fills_the_rejected_mask():
    s = TrainingSample(**BASE, rejected_ids=[7, 8])
    assert s.rejected_loss_mask == [1, 1] and s.num_tokens == 7


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"loss_mask": [1, 0]}, "loss_mask has 2 values"),
        ({"loss_mask": [1, 2, 0]}, "only 0 and 1"),
        ({"token_advantages": [1.0]}, "token_advantages has 1"),
        ({"old_logps": [0.0] * 4}, "old_logps has 4"),
        ({"ref_logps": []}, "ref_logps has 0"),
        ({"advantage": 1.0, "token_advantages": [1.0, 1.0, 1.0]}, "not both"),
        ({"rejected_loss_mask": [1]}, "rejected_ids is None"),
        ({"rejected_ids": [1, 2], "rejected_loss_mask": [1]}, "rejected_loss_mask has 1"),
        ({"rejected_ids": [1, 2], "rejected_ref_logps": [0.0]}, "rejected_ref_logps has 1"),
        ({"weight": -1.0}, "weight must be"),
        ({"weight": float("nan")}, "weight must be"),
        ({"prompt_ids": []}, "empty prompt"),
    ],
)
def test_validation_names_the_wrong_field(extra, message):
    with pytest.raises(ValueError, match=message):
        TrainingSample(**{**BASE, **extra})
