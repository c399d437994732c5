"""The MCP front end: ``execgate mcp`` serves a ``shell`` tool whose commands are gated.

One module per concern:

* :mod:`.wire`, :mod:`.protocol`, :mod:`.rpc` -- MCP's JSON-RPC over stdio (no SDK): messages,
  protocol versions and eras, one connection on the event loop;
* :mod:`.opening` -- the first answers (``initialize``), given while the server starts;
* :mod:`.tool` -- the tool's schema (Codex's), its arguments and its result;
* :mod:`.calls` -- one tool call: session, shell, output, the stopwatch that pauses for humans;
* :mod:`.elicitation` -- questions to humans: elicitation (both protocol generations), the
  approvals registry, timeouts;
* :mod:`.control` -- the control socket ``execgate approvals`` talks to;
* :mod:`.server` -- what each request means, and the calls of a connection; rules hot reload
  is :mod:`execgate.gate.reload`, shared with ``execgate run``.

Nothing is imported here: the opening imports only what the first answer needs.
See docs/mcp.md.
"""
