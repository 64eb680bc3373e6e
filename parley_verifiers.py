"""verifiers' name for parley's environment: ``vf-eval parley-verifiers --env.taskset...``.

verifiers imports an environment by a top-level module name (``parley-verifiers`` ->
``parley_verifiers``), so this module re-exports
:mod:`parley.arena.integrations.verifiers_env`, where the environment is defined and
documented.
"""

from parley.arena.integrations.verifiers_env import (
    ParleyEnv,
    ParleyHarness,
    ParleyTaskset,
    load_environment,
)

__all__ = ["ParleyEnv", "ParleyHarness", "ParleyTaskset", "load_environment"]
