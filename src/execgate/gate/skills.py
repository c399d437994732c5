"""Skill scripts: programs under ``<skills dir>/<skill>/scripts/`` always ask a human.

Agents' skills ship scripts the agent runs on its own say-so; whatever the rules say, running
one asks (docs/policy.md, "Skill scripts"). A script is recognised by its canonical path or its
file identity (a hard link elsewhere is the same file), both when it is executed itself and when
an interpreter is given it as its script argument (``bash script.sh``, ``python3 tool.py``).
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from execgate import paths
from execgate.config import Config
from execgate.gate.program import GatedExec

#: Programs whose first non-option argument is a script they run.
INTERPRETERS = frozenset(
    ("bash", "sh", "dash", "zsh", "ksh", "mksh", "ash", "python", "perl", "ruby", "node", "php")
)
#: Options of those that take a value (the script is the argument after it).
_WITH_VALUE = frozenset(("-o", "-O", "+O", "-m", "-W", "-X", "-I", "-r"))
#: Options after which there is no script (the code is on the command line or stdin).
_NO_SCRIPT = frozenset(("-c", "-e", "-E", "-s", "-", "-lc", "-ic", "-m", "--eval", "-p"))
_VERSION = re.compile(r"[\d.]+$")
#: Files listed per skills folder at most (the snapshot names each one).
_MAX_FILES = 4096


def skill_scripts(config: Config) -> SkillScripts:
    """The skill folders ``config`` names (``skills_dirs``), else the defaults:
    ``$CODEX_HOME/skills`` and ``$EXECGATE_HOME/skills``."""
    if config.skills_dirs is not None:
        return SkillScripts([Path(d) for d in config.skills_dirs])
    return SkillScripts([paths.codex_home() / "skills", paths.execgate_home() / "skills"])


def interpreter_name(path: str) -> str:
    """``python3.12`` → ``python``: the family an interpreter's file name belongs to."""
    return _VERSION.sub("", posixpath.basename(path))


def script_argument(argv: Sequence[str]) -> str | None:
    """The script an interpreter's ``argv`` names, or None (``-c CODE``, stdin, ...)."""
    words = iter(argv[1:])
    for word in words:
        if word == "--":
            return next(words, None)
        if word in _NO_SCRIPT or (word.startswith("-") and word.endswith("c") and word[1:2] != "-"):
            return None
        if word in _WITH_VALUE:
            next(words, None)
            continue
        if word.startswith(("-", "+")):
            continue
        return word
    return None


class SkillScripts:
    """The skill folders of a front end, looked at afresh on every question (a skill added
    while the server runs counts at once)."""

    def __init__(self, dirs: Sequence[Path]) -> None:
        self.dirs = tuple(Path(os.path.realpath(os.path.expanduser(d))) for d in dirs)
        self._dir_names = tuple(map(str, self.dirs))  # checked on every exec: os.path is cheaper

    def scripts_dirs(self) -> list[Path]:
        """Every ``<dir>/<skill>/scripts`` folder that exists (canonical)."""
        found = []
        for base in self.dirs:
            try:
                skills = sorted(os.scandir(base), key=lambda e: e.name)
            except OSError:
                continue
            for skill in skills:
                scripts = Path(os.path.realpath(os.path.join(skill.path, "scripts")))
                if skill.is_dir() and scripts.is_dir() and self._inside(str(scripts)):
                    found.append(scripts)
        return found

    def _inside(self, real: str) -> bool:
        return any(real.startswith(f"{base}/") for base in self.dirs)

    def files(self) -> list[str]:
        """The canonical paths of the files under every scripts folder (bounded)."""
        found: list[str] = []
        for scripts in self.scripts_dirs():
            for root, dirs, names in os.walk(scripts):
                dirs.sort()
                for name in sorted(names):
                    found.append(os.path.join(root, name))
                    if len(found) >= _MAX_FILES:
                        return found
        return found

    def watch_folders(self) -> set[str]:
        """Folders whose changes can add a script (for the snapshot's watch)."""
        folders = {str(d) for d in self.dirs if d.is_dir()}
        for scripts in self.scripts_dirs():
            folders.add(str(scripts))
            folders.add(str(scripts.parent))
            for root, dirs, _ in os.walk(scripts):
                folders.update(os.path.join(root, d) for d in dirs)
        return folders

    def owns(self, path: str, file_id: tuple[int, int] | None = None) -> str | None:
        """The canonical path of the skill script ``path`` is (by path, or by identity: a
        hard link elsewhere), else None."""
        real = os.path.realpath(path)
        for scripts in self.scripts_dirs():
            if real.startswith(f"{scripts}/"):
                return real
        if file_id is not None:
            for candidate in self.files():
                try:
                    st = os.stat(candidate)
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) == file_id:
                    return candidate
        return None

    def script_of(self, exec_: GatedExec) -> str | None:
        """The skill script this exec runs: the file itself, or an interpreter's script."""
        if not any(map(os.path.isdir, self._dir_names)):
            return None
        program = exec_.realpath or exec_.path
        owned = self.owns(program, (exec_.dev, exec_.ino))
        if owned is not None:
            return owned
        runs = exec_.interpreters[-1].file.realpath if exec_.interpreters else program
        if interpreter_name(runs) not in INTERPRETERS and not any(
            interpreter_name(name) in INTERPRETERS for name in (program, exec_.path)
        ):
            return None
        script = script_argument(exec_.argv)
        if script is None:
            return None
        path = os.path.join(exec_.cwd, script)
        try:
            st = os.stat(path)
        except OSError:
            return self.owns(path)
        return self.owns(path, (st.st_dev, st.st_ino))

    def sourced_by(self, command: str, cwd: str) -> list[str]:
        """Skill scripts a shell command line reads with ``source``/``.`` (a builtin: no exec
        the gate could see). Only the line itself: a script that sources one is out of reach."""
        if not any(d.is_dir() for d in self.dirs):
            return []
        lexer = shlex.shlex(command.replace("\n", " ; "), posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        try:
            tokens = list(lexer)
        except ValueError:
            return []
        found = []
        for i, token in enumerate(tokens[:-1]):
            starts = i == 0 or set(tokens[i - 1]) <= set(";&|()")
            if token in ("source", ".") and starts:
                path = os.path.join(cwd, os.path.expanduser(tokens[i + 1]))
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                owned = self.owns(path, (st.st_dev, st.st_ino))
                if owned is not None and owned not in found:
                    found.append(owned)
        return found

    def snapshot_tokens(self) -> list[str]:
        """What the interposer must ask about: every script, and the interpreters (which may
        be given one as their argument). Nothing while no skills folder exists."""
        if not self.scripts_dirs():
            return []
        return [*self.files(), *sorted(INTERPRETERS), "python3"]
