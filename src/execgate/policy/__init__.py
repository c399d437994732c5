"""The policy engine: Codex-compatible ``.rules`` files, layered, evaluated per command.

Typical use::

    loaded = load_layered_policy(Path.cwd())
    evaluation = loaded.policy.evaluate(["git", "push"], resolve_host_executables=True)
    evaluation.decision   # Decision.PROMPT
    evaluation.reason()   # "`git push` requires approval: ..."
"""

# The names below are imported on first use (PEP 562): a front end that loads a cached policy
# imports only the modules it needs (start-up time), e.g. not the Starlark evaluator.
from typing import TYPE_CHECKING

from execgate.lazy import lazy_exports

if TYPE_CHECKING:
    from execgate.policy.amend import allow_rule_line, append_allow_rule, remove_allow_rule
    from execgate.policy.cache import RulesCache
    from execgate.policy.evaluate import Evaluation, Policy, resolve_program_path
    from execgate.policy.layers import (
        LoadedPolicy,
        RulesSource,
        is_trusted,
        load_chosen_policy,
        load_layered_policy,
        project_root,
        trust_project,
        trusted_projects,
        untrust_project,
    )
    from execgate.policy.loader import load_rules_files
    from execgate.policy.model import (
        Decision,
        NetworkRule,
        PolicyError,
        PrefixRule,
        RuleMatch,
        SourceLocation,
    )

_HOMES = {
    "allow_rule_line": "amend",
    "append_allow_rule": "amend",
    "remove_allow_rule": "amend",
    "RulesCache": "cache",
    "Evaluation": "evaluate",
    "Policy": "evaluate",
    "resolve_program_path": "evaluate",
    "LoadedPolicy": "layers",
    "RulesSource": "layers",
    "is_trusted": "layers",
    "load_chosen_policy": "layers",
    "load_layered_policy": "layers",
    "project_root": "layers",
    "trust_project": "layers",
    "trusted_projects": "layers",
    "untrust_project": "layers",
    "load_rules_files": "loader",
    "Decision": "model",
    "NetworkRule": "model",
    "PolicyError": "model",
    "PrefixRule": "model",
    "RuleMatch": "model",
    "SourceLocation": "model",
}


__getattr__ = lazy_exports(__name__, globals(), _HOMES)


__all__ = [
    "Decision",
    "Evaluation",
    "LoadedPolicy",
    "NetworkRule",
    "Policy",
    "PolicyError",
    "PrefixRule",
    "RuleMatch",
    "RulesCache",
    "RulesSource",
    "SourceLocation",
    "allow_rule_line",
    "append_allow_rule",
    "is_trusted",
    "load_chosen_policy",
    "load_layered_policy",
    "load_rules_files",
    "project_root",
    "remove_allow_rule",
    "resolve_program_path",
    "trust_project",
    "trusted_projects",
    "untrust_project",
]
