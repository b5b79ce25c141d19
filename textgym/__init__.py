"""textgym: any Gymnasium environment becomes a text environment for LLM agents."""

from textgym.checker import check_text_env
from textgym.formatters import Formatter, FunctionFormatter, GenericFormatter, TemplateFormatter
from textgym.loops import ChatAPIError, ChatCompletionsPolicy, evaluate_callable
from textgym.parsers import ActionParseError, ActionParser, FunctionParser, JSONActionParser
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
    "ChatAPIError",
    "ChatCompletionsPolicy",
    "ChatMessages",
    "Formatter",
    "FunctionFormatter",
    "FunctionParser",
    "GenericFormatter",
    "JSONActionParser",
    "TemplateFormatter",
    "TextEnvWrapper",
    "ToolEnv",
    "UnicodeText",
    "check_text_env",
    "evaluate_callable",
    "make_text_env",
    "record_trajectories",
    "register",
    "registered_ids",
    "schema_from_space",
    "tool_env",
]
