"""The K = 2 referential game the training tests share (4 one-word objects, one-letter
messages, the listener answers by name, the speaker sees the target alone): the small
version of ``examples/referential.yaml``."""

from __future__ import annotations

SCENARIO = "collaboration/referential-v0"

REFERENTIAL_K2 = {
    "n_candidates": 2,
    "n_attributes": 1,
    "n_values": 4,
    "vocab_size": 4,
    "message_length": 1,
    "answer": "name",
    "show_others": False,
}
