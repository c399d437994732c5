"""execgate: gate every program execution of a shell and everything it starts, by policy."""

__version__ = "0.1.0"
