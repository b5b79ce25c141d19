"""textgym: any Gymnasium environment becomes a text environment for LLM agents."""

from textgym.chat_api import ChatAPIError, ChatCompletionsPolicy
from textgym.checker import check_text_env
from textgym.episodes import Episode, Step, reply_choices, reply_schemas, run_episodes
from textgym.evaluation import Evaluation, evaluate
from textgym.formatters import Formatter, FunctionFormatter, GenericFormatter, TemplateFormatter
from textgym.parsers import ActionParseError, ActionParser, FunctionParser, JSONActionParser
from textgym.policy import CallablePolicy, Policy, PolicyBase, as_policy
from textgym.recording import record_trajectories
from textgym.registration import make_text_env, register, registered_ids
from textgym.schemas import ActionSchema, schema_from_space
from textgym.spaces import ChatMessages, UnicodeText
from textgym.tool_calling import ToolEnv, tool_env
from textgym.wrappers import TextEnvWrapper

__all__ = [
    "ActionParseError",
    "ActionParser",
    "ActionSchema",
    "CallablePolicy",
    "ChatAPIError",
    "ChatCompletionsPolicy",
    "ChatMessages",
    "Episode",
    "Evaluation",
    "Formatter",
    "FunctionFormatter",
    "FunctionParser",
    "GenericFormatter",
    "JSONActionParser",
    "Policy",
    "PolicyBase",
    "Step",
    "TemplateFormatter",
    "TextEnvWrapper",
    "ToolEnv",
    "UnicodeText",
    "as_policy",
    "check_text_env",
    "evaluate",
    "make_text_env",
    "record_trajectories",
    "register",
    "registered_ids",
    "reply_choices",
    "reply_schemas",
    "run_episodes",
    "schema_from_space",
    "tool_env",
]
