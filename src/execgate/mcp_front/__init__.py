"""The MCP front end: ``execgate mcp`` serves a ``shell`` tool whose commands are gated.

One module per concern:

* :mod:`.tool` -- the tool's schema (Codex's), its arguments and its result;
* :mod:`.calls` -- one tool call: session, shell, output, the stopwatch that pauses for humans;
* :mod:`.elicitation` -- questions to humans: elicitation (both protocol generations), the
  approvals registry, timeouts;
* :mod:`.control` -- the control socket ``execgate approvals`` talks to;
* :mod:`.server` -- the MCP server wiring (SDK low-level server, stdio); rules hot reload is
  :mod:`execgate.gate.reload`, shared with ``execgate run``.

See docs/mcp.md.
"""

from execgate.mcp_front.server import McpOptions, serve

__all__ = ["McpOptions", "serve"]
