"""Every negotiation version plays as it did before its classes shared code (commit 8c182f2):
golden digests of baseline and mixed-agent transcripts (tests/scenarios/negotiation/golden.py)."""

from tests.scenarios.negotiation.golden import golden_test

GOLDEN = [
    ("negotiation/deal-or-no-deal-v0", {}, "aef27cd38eb8bae4"),
    ("negotiation/deal-or-no-deal-v1", {}, "0341806a531a3caa"),
    ("negotiation/deal-or-no-deal-v2", {}, "6796aa485a116afe"),
    ("negotiation/deal-or-no-deal-v3", {}, "3cffc52290884e6d"),
    ("negotiation/simple-trade-v0", {}, "a4f6135c9f3cc8d0"),
    ("negotiation/simple-trade-v1", {}, "cf027f200f4833eb"),
    ("negotiation/simple-trade-v2", {}, "622fad412f2b0b85"),
    ("negotiation/split-the-pie-v0", {}, "e54e3192991e8709"),
    ("negotiation/split-the-pie-v1", {}, "477b7825420f8281"),
    ("negotiation/deal-or-no-deal-v2", {"max_turns": 6, "moves": "proposals"}, "886a8a709b712764"),
    ("negotiation/deal-or-no-deal-v3", {"moves": "proposals"}, "22df4ce7021a4b8a"),
    ("negotiation/simple-trade-v1", {"randomize": True}, "7e8a10a8db40da7c"),
    ("negotiation/simple-trade-v2", {"max_turns": 6, "randomize": True}, "4022b86645420f0a"),
    ("negotiation/split-the-pie-v1", {"max_rounds": 3, "n_players": 4}, "6e1986de6dbaabfc"),
    ("negotiation/deal-or-no-deal-v1", {"max_cycles": 3}, "4937f5603c730a1b"),
]

test_transcripts_match_the_golden_digest = golden_test(GOLDEN)
