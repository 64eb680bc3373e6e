"""Tools for scenarios: callables with JSON schemas, a safe calculator, a sandbox for code.

    >>> from parley.scenarios.tools import ToolBox, tool
    >>> @tool
    ... def add(a: int, b: int) -> int:
    ...     'Add two integers.'
    ...     return a + b
    >>> ToolBox([add]).specs()[0]["function"]["name"]
    'add'

The action syntax shared by tool-use scenarios is documented in
:mod:`parley.scenarios.tools.tool`; the sandbox's isolation in
:mod:`parley.scenarios.tools.sandbox`.
"""

from parley.scenarios.tools.sandbox import Sandbox, SandboxError, SandboxLimits, SandboxResult
from parley.scenarios.tools.tool import (
    Tool,
    ToolBox,
    ToolFailure,
    Turn,
    encode_turn,
    parse_turn,
    tool,
    tool_results,
    validate,
)

__all__ = [
    # tools
    "Tool",
    "ToolBox",
    "ToolFailure",
    "tool",
    "validate",
    # the action syntax
    "Turn",
    "parse_turn",
    "encode_turn",
    "tool_results",
    # running untrusted code
    "Sandbox",
    "SandboxLimits",
    "SandboxResult",
    "SandboxError",
]
