"""Every collaboration version plays as it did before its classes shared code (commit 8c182f2):
golden digests of baseline and mixed-agent transcripts (tests/scenarios/negotiation/golden.py)."""

from tests.scenarios.negotiation.golden import golden_test

GOLDEN = [
    ("collaboration/hidden-profile-v0", {}, "4970a0ed6f132af4"),
    ("collaboration/hidden-profile-v1", {}, "4965335fa9701b80"),
    ("collaboration/hidden-profile-v2", {}, "5b95f382d51abdb9"),
    ("collaboration/referential-v0", {}, "61bca03c6ef795aa"),
    ("collaboration/referential-v1", {}, "871b306c9588b27b"),
    ("collaboration/hidden-profile-v1", {"notebook": True, "talk": "share"}, "e5b884d15a9979f3"),
    ("collaboration/hidden-profile-v2", {"n_agents": 4, "n_options": 4}, "35d3d6bff9c512af"),
    ("collaboration/referential-v1", {"answer": "name"}, "9a458ada2a591302"),
]

test_transcripts_match_the_golden_digest = golden_test(GOLDEN)
