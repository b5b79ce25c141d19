"""The ``"vllm"`` rollout engine: a policy's replies sampled by a vLLM server, its adapter synced.

:class:`VLLMEngine` sends token ids to the server and returns the same
:class:`~textgym_agents.decoding.generation.Generation` the HF path returns. Before each generation
it checks whether the learner's LoRA weights changed (their in-place version counters) and, if so,
saves the adapter to a fresh directory and loads it under a fresh name, then unloads the old one:
the server's prefix cache is keyed by adapter name, so reusing a name would serve stale
key/values. PPO's old log-probs still come from the trainer's own scoring pass.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from textgym_agents.decoding.choices import ChoiceScores
from textgym_agents.decoding.generation import Generation, cut_reply
from textgym_agents.engines.vllm_client import (
    Completion,
    VLLMClient,
    VLLMResponseError,
    VLLMServerError,
)
from textgym_agents.engines.vllm_grammar import constrained_rollout
from textgym_agents.engines.vllm_server import SERVED_NAME, VLLMServer

if TYPE_CHECKING:
    from textgym_agents.policy import PPOPolicy

__all__ = ["VLLMEngine", "model_dir_of"]

logger = logging.getLogger(__name__)


def model_dir_of(policy: PPOPolicy) -> Path:
    """The local directory of the policy's base model, which the server loads.

    The embedded model is served from its float32 safetensors copy
    (:func:`~textgym_agents.model.loading.embedded_model_dir`); a GGUF base has no such directory.
    """
    from textgym_agents.model.loading import embedded_model_dir

    info = policy.base_info
    name = info.get("name_or_path")
    if info.get("gguf_file") or (isinstance(name, str) and name.endswith(".gguf")):
        raise ValueError(
            "rollout_engine='vllm' needs the base model as a save_pretrained directory, got a "
            f"GGUF file ({name}); save the model (model.save_pretrained(dir)) and load that"
        )
    path = embedded_model_dir() if name in (None, "embedded") else Path(str(name))
    if not path.exists() and isinstance(name, str) and name.count("/") == 1:
        try:  # a Hugging Face id: its snapshot in the local cache (nothing is downloaded)
            from huggingface_hub import snapshot_download

            path = Path(snapshot_download(name, local_files_only=True))
        except Exception:  # not in the cache: the error below says what is needed
            pass
    if not (path / "config.json").is_file():
        raise ValueError(
            f"rollout_engine='vllm' needs the base model in a local directory with config.json, "
            f"got {name!r} ({path})"
        )
    return path


class VLLMEngine:
    """Generates a policy's replies on a vLLM server (one it was given, or one it starts).

    Args:
        policy: The policy whose learner adapter is served; its config holds the sampling
            settings and the ``vllm_*`` settings.
        url: A running server (``vllm serve MODEL --enable-lora`` with
            ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, serving the policy's base model as
            ``base``); None starts one from ``config.vllm_python`` on 127.0.0.1.
        adapter_dir: Where adapters are written for the server to read (a shared path when
            the server runs on another machine); default a temporary directory.
    """

    def __init__(
        self,
        policy: PPOPolicy,
        *,
        url: str | None = None,
        adapter_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        config = policy.config
        self.policy = policy
        self.learner = policy.model.active_adapter
        self.server: VLLMServer | None = None
        if url is None:
            self.server = VLLMServer(
                model_dir_of(policy),
                python=config.vllm_python,
                port=config.vllm_port,
                max_lora_rank=int(policy.model.peft_config[self.learner].r),
                dtype=str(policy.base_info.get("dtype") or "float32"),
                seed=config.seed,
                start_timeout=config.vllm_start_timeout,
                request_timeout=config.vllm_request_timeout,
                extra_args=config.vllm_server_args,
            )
            self.client = self.server.client
        else:
            self.client = VLLMClient(url, timeout=config.vllm_request_timeout)
        try:
            self.version = self.client.version()  # fails early on a wrong or unreachable server
        except BaseException:
            if self.server is not None:
                self.server.close()
            raise
        self._own_dir = adapter_dir is None
        root = adapter_dir or tempfile.mkdtemp(prefix="textgym-vllm-adapters-")
        self.adapter_root = Path(root)
        self.adapter_root.mkdir(parents=True, exist_ok=True)
        self._run = uuid.uuid4().hex[:8]  # names unique across trainers sharing one server
        self._count = itertools.count(1)
        self.adapter: tuple[str, Path] | None = None  # (name, path) being served
        self._synced: tuple[tuple[int, int], ...] | None = None
        self.syncs = 0

    # --- adapter sync ------------------------------------------------------------------------

    def _fingerprint(self) -> tuple[tuple[int, int], ...]:
        """Identity and in-place version of every learner LoRA tensor: any update moves it."""
        marker = f".{self.learner}."
        return tuple(
            (id(p), p._version)
            for name, p in self.policy.model.named_parameters()
            if "lora_" in name and marker in name + "."
        )

    def sync_adapter(self, force: bool = False) -> str:
        """Serve the learner's current weights; return the served name.

        A no-op while the weights are unchanged (unless ``force``). Otherwise the adapter is
        saved to a fresh directory, loaded under a fresh name, and only then is the old one
        unloaded and deleted, so every request is served by exactly one adapter version.
        """
        fingerprint = self._fingerprint()
        if not force and self.adapter is not None and fingerprint == self._synced:
            return self.adapter[0]
        number = next(self._count)
        name = f"textgym-{self._run}-{number}"
        path = self.adapter_root / f"adapter-{number:06d}"
        self.policy.model.save_pretrained(path, selected_adapters=[self.learner])
        if self.learner != "default":  # peft writes named adapters into a subdirectory
            path = path / self.learner
        self.client.load_adapter(name, str(path))
        old, self.adapter, self._synced = self.adapter, (name, path), fingerprint
        self.syncs += 1
        if old is not None:
            self.client.unload_adapter(old[0])
            shutil.rmtree(self.adapter_root / old[1].relative_to(self.adapter_root).parts[0])
        logger.debug("vLLM serves adapter %s from %s", name, path)
        return name

    # --- generation --------------------------------------------------------------------------

    def rollout(
        self,
        prompts: list[list[int]],
        mode: str,
        choices: Sequence[Sequence[str]] | None,
        schemas: Sequence[dict[str, Any] | None] | None = None,
        *,
        greedy: bool,
        max_new_tokens: int,
    ) -> Generation:
        """What :meth:`PPOPolicy.generate <textgym_agents.PPOPolicy.generate>` returns, from vLLM.

        Free text, one of each row's ``choices``, or a reply under each row's schema (``mode``
        from :func:`~textgym_agents.decoding.constrained.decoding_mode`).

        A choice is drawn from the distribution over the row's choices, scored with
        ``prompt_logprobs``; ``Generation.logps`` stays None, so the trainer scores the turn
        itself and PPO's ratio is exact. A constrained reply is sampled under the server's
        llguidance grammar and carries the masks this process rebuilds
        (:func:`~textgym_agents.engines.vllm_grammar.replay`), so scoring masks the same tokens.
        """
        if mode == "constrained":
            assert schemas is not None
            return constrained_rollout(
                self, prompts, schemas, greedy=greedy, max_new_tokens=max_new_tokens
            )
        if mode == "choices":
            assert choices is not None
            ids = [self.policy.choice_ids(replies) for replies in choices]
            picks = self.choice_scores(prompts, ids).sample(greedy)
            return Generation(
                prompts,
                [ids[b][k] for b, k in enumerate(picks)],
                [choices[b][k] for b, k in enumerate(picks)],
                choice_ids=ids,
            )
        return self.generate(prompts, greedy=greedy, max_new_tokens=max_new_tokens)

    def generate(
        self,
        prompts: list[list[int]],
        *,
        greedy: bool = False,
        max_new_tokens: int,
        adapter: bool = True,
    ) -> Generation:
        """Free-text replies, cut exactly as the HF path cuts them (EOS, stop strings).

        ``Generation.token_logps`` holds the server's log-prob of each reply token; PPO does
        not use them (its old log-probs come from the trainer's scoring pass).
        """
        policy, config = self.policy, self.policy.config
        completions = self.complete(
            prompts,
            greedy=greedy,
            max_new_tokens=max_new_tokens,
            stop=config.stop_strings,
            adapter=adapter,
        )
        responses, logps = [], []
        for completion in completions:
            ids = cut_reply(
                completion.token_ids, policy.tokenizer, policy.eos_ids, config.stop_strings
            )
            responses.append(ids)
            logps.append(completion.logps[: len(ids)])
        texts = policy.tokenizer.batch_decode(responses, skip_special_tokens=True)
        prefix = config.reply_prefix
        return Generation(prompts, responses, [prefix + text for text in texts], token_logps=logps)

    def complete(
        self,
        prompts: list[list[int]],
        *,
        greedy: bool,
        max_new_tokens: int,
        stop: Sequence[str],
        adapter: bool = True,
        json_schema: dict[str, Any] | None = None,
    ) -> list[Completion]:
        """The server's continuations under the config's sampling settings, token ids checked.

        ``json_schema`` samples under that schema (the server's structured outputs).
        """
        policy, config = self.policy, self.policy.config
        model = self.sync_adapter() if adapter else SERVED_NAME
        completions = self.client.complete(
            prompts,
            model=model,
            max_tokens=max_new_tokens,
            temperature=0.0 if greedy else config.temperature,
            top_p=1.0 if greedy else config.top_p,
            top_k=0 if greedy else config.top_k,
            stop=stop,
            stop_token_ids=sorted(policy.eos_ids),
            seed=None if greedy else int(torch.randint(0, 2**31 - 1, ())),
            json_schema=json_schema,
        )
        vocab = len(policy.tokenizer)
        for b, completion in enumerate(completions):
            if (
                any(t >= vocab for t in completion.token_ids)
                or len(completion.token_ids) > max_new_tokens
            ):
                raise VLLMResponseError(
                    f"Expected at most {max_new_tokens} token ids < {vocab} in reply {b}, got "
                    f"{completion.token_ids[:50]}; does the server run the policy's base model?"
                )
        return completions

    def choice_scores(
        self, prompts: Sequence[list[int]], choices: Sequence[Sequence[list[int]]]
    ) -> ChoiceScores:
        """Distribution over each prompt's choices, from the server's ``prompt_logprobs``.

        Each (prompt, choice) sequence is one prompt of one request; the server's prefix cache
        runs each prompt once. Scores are the choices' summed (or, with
        ``config.choice_length_norm``, mean) token log-probs over ``config.temperature``.
        """
        config = self.policy.config
        model = self.sync_adapter()
        pairs = [(p, c) for p, options in zip(prompts, choices, strict=True) for c in options]
        logps = self.client.prompt_logprobs([list(p) + list(c) for p, c in pairs], model=model)
        totals = []
        for row, (p, c) in zip(logps, pairs, strict=True):
            tail = row[len(p) :]
            if len(tail) != len(c) or any(x is None for x in tail):
                raise VLLMResponseError("Expected a log-prob for every choice token")
            total = sum(tail)  # type: ignore[arg-type]
            totals.append(total / len(c) if config.choice_length_norm else total)
        scores = torch.tensor(totals, dtype=torch.float64) / config.temperature
        sizes = [len(options) for options in choices]
        return ChoiceScores([s.log_softmax(0) for s in scores.split(sizes)], None)

    def close(self) -> None:
        """Unload the served adapter, stop a server this engine started, delete its files."""
        if self.adapter is not None and self.server is None:
            try:  # a shared server keeps running: leave no adapter of ours behind
                self.client.unload_adapter(self.adapter[0])
            except VLLMServerError as error:
                logger.warning("Could not unload adapter %s: %s", self.adapter[0], error)
        self.adapter = None
        if self.server is not None:
            self.server.close()
            self.server = None
        if self._own_dir:
            shutil.rmtree(self.adapter_root, ignore_errors=True)

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
