"""The policy engine: Codex-compatible ``.rules`` files, layered, evaluated per command.

Typical use::

    loaded = load_layered_policy(Path.cwd())
    evaluation = loaded.policy.evaluate(["git", "push"], resolve_host_executables=True)
    evaluation.decision   # Decision.PROMPT
    evaluation.reason()   # "`git push` requires approval: ..."
"""

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
