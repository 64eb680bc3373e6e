"""Every tool_use version plays as it did before its classes shared code (commit 8c182f2):
golden digests of baseline and mixed-agent transcripts (tests/scenarios/negotiation/golden.py)."""

from tests.scenarios.negotiation.golden import golden_test

GOLDEN = [
    ("tool_use/calc-chain-v0", {}, "46bb4f3bf5bad4c0"),
    ("tool_use/calc-chain-v1", {}, "e261a06884ca76fb"),
    ("tool_use/research-team-v0", {}, "eb2ed38c9402212b"),
    ("tool_use/retail-desk-v0", {}, "7534e26b699e41fd"),
    ("tool_use/retail-desk-v1", {}, "2a8fe76ac35a1e88"),
    ("tool_use/retail-desk-v2", {}, "071b444c212ef588"),
    ("tool_use/retail-desk-v3", {}, "6b02d64495dbbcc5"),
    ("tool_use/calc-chain-v1", {"difficulty": 3}, "cc1339df968bad70"),
    ("tool_use/retail-desk-v3", {"difficulty": 2}, "4ed947862ec2c324"),
]

test_transcripts_match_the_golden_digest = golden_test(GOLDEN)
