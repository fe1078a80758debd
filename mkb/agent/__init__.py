"""The agent: one attempt at one problem variant with any OpenAI-compatible model (DESIGN §6)."""

from mkb.agent.budget import Budget, Usage
from mkb.agent.executor import ExecResult, Executor, LocalExecutor
from mkb.agent.loop import AttemptResult, run_attempt
from mkb.agent.model import (PROVIDERS, ChatModel, ContextExhausted, ModelConfig, ProviderError, ScriptedModel,
                             parse_model_spec, tool_call)
from mkb.agent.prompts import Gpu, template_hashes, templates_sha256
from mkb.agent.tools import TOOL_NAMES, TOOL_SPECS, Submission
from mkb.agent.workspace import docs_sha256, prepare_workspace

__all__ = [
    "PROVIDERS", "TOOL_NAMES", "TOOL_SPECS", "AttemptResult", "Budget", "ChatModel", "ContextExhausted",
    "ExecResult", "Executor", "Gpu", "LocalExecutor", "ModelConfig", "ProviderError", "ScriptedModel",
    "Submission", "Usage", "docs_sha256", "parse_model_spec", "prepare_workspace", "run_attempt", "template_hashes",
    "templates_sha256", "tool_call",
]
