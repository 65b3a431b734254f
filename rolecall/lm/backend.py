"""The shared model behind every :class:`~rolecall.lm.local.LocalLM` view: weights, tokenizer, LoRA adapters, batcher.

One backend holds one base model. Role views (``lm.for_role("plan")``) are LoRA adapters on it, created on first use;
they share the base weights, and their requests share batches (PEFT's mixed-adapter ``adapter_names``). A re-entrant
lock serialises forward passes and optimizer steps so a trainer can update an adapter in place while other threads
keep generating.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from rolecall.errors import ConfigError, ModelLoadError
from rolecall.lm.adapter_files import check_adapter_folder
from rolecall.lm.attention import use_rowwise_attention
from rolecall.lm.batching import RequestBatcher
from rolecall.lm.continuous import ContinuousBatcher
from rolecall.lm.embedded import resolve_model_path
from rolecall.lm.generation import Completion, GenerationRequest, generate_batch
from rolecall.lm.memory import limit_heap_fragmentation
from rolecall.lm.peft_load import load_peft_adapter

T = TypeVar("T")

__all__ = ["ModelBackend", "cpu_has_native_bf16", "default_lora_config"]

logger = logging.getLogger(__name__)


def default_lora_config(num_layers: int | None = None, **overrides: Any) -> Any:
    """The LoRA config role adapters get unless one is given: r=8, alpha=32 (STRIDE-FT), all attention and MLP
    projections, dropout 0, on the top half of the decoder layers when ``num_layers`` is given.

    Why the top half: the frozen lower layers then need no backward pass and keep no activations for one, so a
    training step costs about 2/3 of an all-layer one (``benchmarks/bench_lora_layers.py``: 14.0 s against 21.1 s,
    1.50x, for 8 samples of 360 + 52 tokens on 2 CPU cores) and holds half the activations, while the role learns
    its format as fast (both parse 100% of held-out analysis calls after 8-12 steps). Pass
    ``layers_to_transform=None`` to adapt every layer.

    Args:
        num_layers: the model's decoder layer count (``config.num_hidden_layers``); None adapts every layer.
        **overrides: any ``peft.LoraConfig`` field.
    """
    from peft import LoraConfig

    kwargs: dict[str, Any] = dict(
        r=8,
        lora_alpha=32,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        task_type="CAUSAL_LM",
    )
    if num_layers is not None and num_layers > 1:
        kwargs["layers_to_transform"] = list(range(num_layers // 2, num_layers))
    kwargs.update(overrides)
    return LoraConfig(**kwargs)


def _pick_device(device: str | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX tiles).

    oneDNN's own check (``torch.ops.mkldnn._is_mkldnn_bf16_supported``) also says yes on plain AVX-512, where bf16
    is emulated: on an AVX-512 Xeon without AVX512-BF16, bf16 ran SmolLM2-135M's MLP matmul at 0.28x the fp32 rate
    and generated at 0.58x its tokens per second (``benchmarks/bench_cpu_dtype.py``), so "auto" takes fp32 there.
    """
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    try:
        return any(bool(getattr(torch.cpu, name)()) for name in probes if hasattr(torch.cpu, name))
    except RuntimeError:
        return False


def _pick_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype == "auto":
        # bf16 on GPUs and on CPUs with native bf16 matmuls (AVX512-BF16 / AMX: about 3x the fp32 rate); fp32 elsewhere
        if device.type == "cuda":
            return torch.bfloat16
        return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    if dtype not in table:
        raise ConfigError(f"dtype must be one of {['auto', *table]}, got {dtype!r}")
    return table[dtype]


@contextlib.contextmanager
def _quiet_peft_wrap() -> Iterator[None]:
    """Hide the FutureWarning PEFT triggers when it wraps a model: it reads transformers' deprecated
    ``is_gradient_checkpointing`` alias, which warns on every read; nothing in rolecall uses it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


class ModelBackend:
    """Weights, tokenizer, adapters and request batcher shared by all views of one LocalLM.

    Args:
        model: a model name (``"embedded:smollm2-135m-instruct"``), a local directory, a hub id, or an already loaded
            ``PreTrainedModel`` (then ``tokenizer`` is required).
        tokenizer: a tokenizer, when ``model`` is an object.
        device: ``"cpu"``, ``"cuda"``...; defaults to CUDA when available.
        dtype: ``"auto"``, ``"float32"``, ``"bfloat16"``, ``"float16"`` or a torch dtype.
        lora_config: the ``peft.LoraConfig`` new role adapters get (default :func:`default_lora_config`).
        max_batch_rows: most sample rows per forward batch.
        max_wait_ms: how long the batcher waits to fill a batch.
        batching: ``"continuous"`` (default: requests join and leave a running decode step by step, and role prompt
            prefixes stay cached across batches; :class:`~rolecall.lm.continuous.ContinuousBatcher`) or ``"static"``
            (each batch decodes until its longest request is done; :class:`~rolecall.lm.batching.RequestBatcher`).
        prefix_cache_mb: memory the continuous batcher's prompt-prefix cache may take.
        rowwise_attention: decode padded batches with :func:`~rolecall.lm.attention.rowwise_sdpa_forward` (default:
            on the CPU only, where it skips the work on each row's padding; outputs agree up to float rounding).

    On the CPU a model on SDPA attention decodes padded batches row by row (:mod:`rolecall.lm.attention`; set
    ``rowwise_attention=False`` to keep transformers' batched SDPA), and it applies
    :func:`rolecall.lm.memory.limit_heap_fragmentation` (``ROLECALL_MALLOC_TUNE``: by default the
    batcher hands freed heap pages back to the system every 2 s; ``heap_trimmer`` is None when it does not).
    """

    def __init__(
        self,
        model: Any,
        *,
        tokenizer: Any = None,
        device: str | None = None,
        dtype: str | torch.dtype = "auto",
        lora_config: Any = None,
        max_batch_rows: int = 32,
        max_wait_ms: float = 15.0,
        batching: str = "continuous",
        prefix_cache_mb: float = 1024.0,
        rowwise_attention: bool | None = None,
    ) -> None:
        if batching not in ("continuous", "static"):
            raise ConfigError(f"batching must be 'continuous' or 'static', got {batching!r}")
        self.device = _pick_device(device)
        # KV caches of ever different sizes would otherwise fragment glibc's heap (see rolecall.lm.memory)
        self.heap_trimmer = limit_heap_fragmentation() if self.device.type == "cpu" else None
        self.lock = threading.RLock()
        if isinstance(model, (str, Path)):
            self.name = str(model)
            self.model, self.tokenizer = self._load(str(model), _pick_dtype(dtype, self.device))
        else:
            if tokenizer is None:
                raise ConfigError("A model object needs its tokenizer: LocalLM(model=model, tokenizer=tokenizer)")
            self.name = getattr(getattr(model, "config", None), "_name_or_path", None) or type(model).__name__
            self.model, self.tokenizer = model.to(self.device), tokenizer
        self.model.eval()
        if rowwise_attention or (rowwise_attention is None and self.device.type == "cpu"):
            use_rowwise_attention(self.model)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.lora_config = lora_config
        self.adapter_versions: dict[str, int] = {}
        self._update_listeners: list[Callable[[str], None]] = []
        self._identity: dict[str, tuple[int, bool]] = {}  # adapter -> (version checked, all LoRA B zero)
        self.eos_token_ids = self._eos_ids()
        self.batcher: RequestBatcher | ContinuousBatcher
        if batching == "static":
            self.batcher = RequestBatcher(self._run_batch, max_batch_rows=max_batch_rows, max_wait_ms=max_wait_ms)
        else:
            self.batcher = ContinuousBatcher(
                self, max_batch_rows=max_batch_rows, max_wait_ms=max_wait_ms, prefix_cache_mb=prefix_cache_mb
            )

    # ------------------------------------------------------------------ loading
    def _load(self, name: str, dtype: torch.dtype) -> tuple[Any, Any]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = resolve_model_path(name)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        except OSError as exc:
            raise ModelLoadError(
                f"Could not load model {name!r} (resolved to {path!r}): {exc}. Use the embedded default "
                "(LocalLM()), a local model directory, or a hub id while online."
            ) from exc
        logger.info("Loaded %s (%s) on %s", name, dtype, self.device)
        return model.to(self.device), tokenizer

    def _eos_ids(self) -> list[int]:
        ids = {self.tokenizer.eos_token_id}
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif isinstance(gen_eos, (list, tuple)):
            ids.update(gen_eos)
        return sorted(i for i in ids if i is not None)

    # ------------------------------------------------------------------ prompts
    def encode_messages(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Token ids of a chat conversation with the generation prompt appended."""
        if getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return list(ids)
        text = "\n\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\n\nassistant:"
        return self.tokenizer(text)["input_ids"]

    # ------------------------------------------------------------------ adapters
    @property
    def is_peft(self) -> bool:
        """Whether the model carries LoRA adapters yet."""
        return hasattr(self.model, "peft_config")

    @property
    def adapters(self) -> list[str]:
        """Names of the LoRA adapters on the model."""
        return list(self.model.peft_config) if self.is_peft else []

    def ensure_adapter(self, name: str) -> None:
        """Create LoRA adapter ``name`` (initialised to the identity, B = 0) unless it exists."""
        if name in self.adapters:
            return
        from peft import get_peft_model

        config = self.lora_config or default_lora_config(getattr(self.model.config, "num_hidden_layers", None))
        with self.lock:
            if name in self.adapters:  # another thread created it meanwhile (programs built concurrently)
                return
            if not self.is_peft:
                with _quiet_peft_wrap():
                    self.model = get_peft_model(self.model, config, adapter_name=name)
            else:
                self.model.add_adapter(name, config)
            self.model.eval()
            # a new adapter starts at version 0; one re-created after delete_adapter continues its count
            self.adapter_versions[name] = self.adapter_versions[name] + 1 if name in self.adapter_versions else 0
        logger.info("Created LoRA adapter %r", name)
        self._notify(name)

    def save_adapter(self, name: str, path: str | Path) -> None:
        """Write adapter ``name`` to ``path`` in PEFT format (``adapter_config.json`` + safetensors)."""
        if name not in self.adapters:
            raise ConfigError(f"No adapter named {name!r}; existing adapters: {self.adapters}")
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        with self.lock:
            self.model.save_pretrained(str(path), selected_adapters=[name], safe_serialization=True)
        # PEFT nests non-default adapters under a sub-folder named after them; flatten to one adapter per folder
        nested = path / name
        if nested.is_dir() and (nested / "adapter_config.json").is_file():
            for f in nested.iterdir():
                f.replace(path / f.name)
            nested.rmdir()

    def load_adapter(self, name: str, path: str | Path) -> None:
        """Load a PEFT adapter from ``path`` as ``name`` (replacing an existing adapter of that name).

        All or nothing: when the folder does not load (a damaged file, an adapter of another base model), the model
        is left as it was, and an adapter being replaced keeps serving its old weights. A replacement is loaded under a
        scratch name first; the old adapter is dropped only once the new weights have loaded.

        Raises:
            ModelLoadError: The folder is damaged or does not fit this base model (one line naming the folder).
        """
        path = check_adapter_folder(path)  # a damaged config or weight file: one line naming it, before PEFT reads it
        with self.lock:
            if name in self.adapters:
                scratch = "rolecall-incoming"
                while scratch in self.adapters:
                    scratch += "-"
                with _quiet_peft_wrap():
                    self.model = load_peft_adapter(self.model, scratch, path)  # on failure `name` is untouched
                self._delete_peft_adapter(name)  # another adapter (scratch) remains: the model stays wrapped
                try:  # the same folder, just read: only a change to it in between makes this fail
                    self.model = load_peft_adapter(self.model, name, path)
                finally:
                    self._delete_peft_adapter(scratch)
            else:
                with _quiet_peft_wrap():
                    self.model = load_peft_adapter(self.model, name, path)
            self.model.eval()
            self.adapter_versions[name] = self.adapter_versions.get(name, 0) + 1
        self._notify(name)

    def _delete_peft_adapter(self, name: str) -> None:
        with warnings.catch_warnings():  # rows name their adapter: which one PEFT deems active is moot
            warnings.filterwarnings("ignore", message="Adapter .* was active which is now deleted")
            self.model.delete_adapter(name)
        if not self.adapters:  # a PeftModel without adapters cannot run: unwrap to the base model
            self.model = self.model.base_model.unload()
            if hasattr(self.model, "peft_config"):  # PEFT < 0.19 leaves the emptied config dict on the base model
                del self.model.peft_config
            self.model.eval()

    def delete_adapter(self, name: str) -> None:
        """Remove LoRA adapter ``name`` from the model; after the last one the model is the plain base model again.

        The adapter's version number is kept (and bumped), so an adapter created or loaded again under the same name
        never reuses a version whose prompt prefixes the batcher cached with the deleted weights.

        Raises:
            ConfigError: If there is no adapter of that name.
        """
        if name not in self.adapters:
            raise ConfigError(f"No adapter named {name!r}; existing adapters: {self.adapters}")
        with self.lock:
            self._delete_peft_adapter(name)
            self.adapter_versions[name] = self.adapter_versions.get(name, 0) + 1
            self._identity.pop(name, None)
        logger.info("Deleted LoRA adapter %r", name)

    def add_update_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(adapter_name)`` whenever an adapter is created, loaded or updated (:meth:`mark_updated`),
        on the thread that changed it and outside the model lock. A served backend uses it to push each trained
        adapter to its inference server; a listener that raises is logged and does not fail the update."""
        self._update_listeners.append(listener)

    def _notify(self, name: str) -> None:
        for listener in list(self._update_listeners):
            try:
                listener(name)
            except Exception:  # a listener is a side channel; the update itself has happened
                logger.exception("adapter update listener failed for %r", name)

    def copy_adapter(self, source: str, target: str) -> None:
        """Make adapter ``target`` (created if missing) hold a copy of ``source``'s LoRA weights, for example a frozen
        reference policy of an adapter about to be trained further.

        Raises:
            ConfigError: If ``source`` does not exist.
        """
        if source not in self.adapters:
            raise ConfigError(f"No adapter named {source!r} to copy; existing adapters: {self.adapters}")
        self.ensure_adapter(target)
        params = dict(self.model.named_parameters())
        with self.lock, torch.no_grad():
            for name, param in params.items():
                if f".{source}." in name and "lora_" in name:
                    params[name.replace(f".{source}.", f".{target}.")].copy_(param)
        self.mark_updated(target)

    def run_on_model_thread(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` on the thread that generates (the batcher's worker) and return its result.

        Training steps go through here, so all of the model's compute stays on one thread and one CPU thread pool
        (see :meth:`~rolecall.lm.batching.QueueBatcher.call`). ``fn`` must not wait for a generation.
        """
        return self.batcher.call(fn)

    def mark_updated(self, name: str) -> None:
        """Record that adapter ``name``'s weights changed. Trainers call this after each optimizer step; any code that
        changes adapter weights by hand must call it too (untrained adapters are routed to the base model)."""
        self.adapter_versions[name] = self.adapter_versions.get(name, 0) + 1
        self._notify(name)

    def is_identity_adapter(self, name: str) -> bool:
        """Whether adapter ``name`` still computes the base model (every LoRA ``B`` matrix is zero, as created).

        Cached per adapter version, so an adapter is re-checked after every ``mark_updated`` / ``load_adapter``.
        """
        version = self.adapter_versions.get(name, 0)
        cached = self._identity.get(name)
        if cached is not None and cached[0] == version:
            return cached[1]
        identity = True
        for module in self.model.modules():
            lora_b = getattr(module, "lora_B", None)
            if lora_b is not None and name in lora_b and bool(lora_b[name].weight.detach().any()):
                identity = False
                break
        self._identity[name] = (version, identity)
        return identity

    def route_identity_adapters(self, requests: Sequence[GenerationRequest]) -> list[GenerationRequest]:
        """Send requests for untrained (identity) adapters to the base model: same output, and a batch mixing many
        adapters (a dozen programs of several roles each) otherwise runs one LoRA matmul per adapter and layer."""
        routed = []
        for r in requests:
            if r.adapter is not None and self.is_peft and self.is_identity_adapter(r.adapter):
                r = dataclasses.replace(r, adapter=None, prefix_group=r.prefix_group or r.adapter)
            routed.append(r)
        return routed

    # ------------------------------------------------------------------ generation
    @contextlib.contextmanager
    def generating(self) -> Iterator[Any]:
        """Hold the lock, in eval and inference mode, for one generation pass; yields the model. A trainer's train mode
        is restored afterwards, and no autograd graph is kept (trainable LoRA weights would otherwise chain one through
        the KV cache). Both batchers generate only through here, so this is also where the heap trimmer runs, once the
        lock is released."""
        with self.lock, torch.inference_mode():
            model = self.model
            was_training = model.training
            if was_training:
                model.eval()
            try:
                yield model
            finally:
                if was_training:
                    model.train()
        if self.heap_trimmer is not None:  # after the lock: a trim must not hold up a trainer's step
            self.heap_trimmer.maybe_trim()

    def _run_batch(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        with self.generating() as model:
            requests = self.route_identity_adapters(requests)
            return generate_batch(model, self.tokenizer, requests, eos_token_ids=self.eos_token_ids)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Submit several requests to the batcher at once and wait for all of them."""
        futures = [self.batcher.submit(r) for r in requests]
        return [f.result() for f in futures]
