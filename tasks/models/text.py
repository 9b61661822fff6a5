"""Hugging Face transformers models as gpulanes models.

- ``TextEmbedding``: sentence embeddings, the mean of an ``AutoModel``'s last
  hidden states over each text's tokens (as sentence-transformers' MiniLM and
  MPNet models are trained to be used), L2-normalised unless asked otherwise.
- ``TextGeneration``: greedy continuation from an ``AutoModelForCausalLM``,
  one progress step per generated token.

Both load model and tokenizer with ``from_pretrained(model_dir / folder)``; as
with ``Diffusion``, a team subclasses to name its folder and version::

    class MiniLM(TextEmbedding):
        folder = "all-MiniLM-L6-v2"      # $GPULANES_MODEL_DIR/all-MiniLM-L6-v2
        version = "all-MiniLM-L6-v2@8b3219a"

    GPULANES_MODELS="minilm=myteam.models:MiniLM"

Submitting processes import this module for ``Input`` only: torch and
transformers are imported inside the methods.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from tasks.models.hf import Progress, Saved, saved_folder, torch_dtype

Text = Annotated[str, Field(min_length=1, max_length=2000)]


class EmbeddingInput(BaseModel):
    """Texts to embed, one vector each, in order."""

    model_config = ConfigDict(extra="forbid")

    texts: list[Text] = Field(min_length=1, max_length=64)
    #: Unit-length vectors, so a dot product is the cosine similarity.
    normalize: bool = True


class GenerationInput(BaseModel):
    """A prompt to continue greedily."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, max_length=8192)
    max_new_tokens: int = Field(64, ge=1, le=256)


class _Pretrained(Saved):
    """What both adapters share: the folder, the dtype, the tokenizer."""

    auto_class: ClassVar[str] = "AutoModel"

    def __init__(self, *, device: str, model_dir: str | Path) -> None:
        path = saved_folder(model_dir, self.folder, what="transformers model")
        import transformers  # after the check: a wrong path fails fast

        self.device, self.path = device, path
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        auto = getattr(transformers, self.auto_class)
        self.model = auto.from_pretrained(path, dtype=torch_dtype(device, self.cuda_dtype))
        self.model.to(device).eval()

    def _context_tokens(self) -> int | None:
        """The longest input the model's position embeddings allow, if it says."""
        config = self.model.config
        return getattr(config, "max_position_embeddings", None) or getattr(
            config, "n_positions", None)


class TextEmbedding(_Pretrained):
    """Mean-pooled sentence embeddings; see the module docstring."""

    Input: ClassVar[type[EmbeddingInput]] = EmbeddingInput
    #: Texts per forward pass: bounds activation memory, and each pass is a progress step.
    batch_size: ClassVar[int] = 16

    def warmup(self) -> None:
        """One short text through the model, so kernels are hot before the first job."""
        self.predict(EmbeddingInput(texts=["warmup"]), lambda done, total: None)

    @classmethod
    def cost(cls, inputs: EmbeddingInput) -> float:
        """Relative cost for wait estimates: forward passes plus thousands of characters
        (called on the class, in the submitting process: no weights there)."""
        chunks = -(-len(inputs.texts) // cls.batch_size)
        return chunks + sum(map(len, inputs.texts)) / 1000

    def predict(self, inputs: EmbeddingInput, progress: Progress) -> dict[str, Any]:
        """``{"embeddings": [[float, ...], ...], "dim": n}``, one row per text, 6 decimals."""
        texts, size = inputs.texts, self.batch_size
        chunks = [texts[i:i + size] for i in range(0, len(texts), size)]
        rows: list[list[float]] = []
        for done, chunk in enumerate(chunks, 1):
            vectors = self._embed(chunk, inputs.normalize)
            rows.extend([round(x, 6) for x in row] for row in vectors.tolist())
            progress(done, len(chunks))
        return {"embeddings": rows, "dim": len(rows[0])}

    def _embed(self, texts: list[str], normalize: bool) -> Any:
        """A float32 ``(len(texts), dim)`` tensor on the CPU."""
        import torch

        batch = self.tokenizer(texts, padding=True, truncation=True,
                               max_length=self._max_length(), return_tensors="pt")
        batch = batch.to(self.device)
        with torch.inference_mode():
            hidden = self.model(**batch).last_hidden_state.float()
        # Padding must not count towards the mean.
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        if normalize:
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
        return pooled.cpu()

    def _max_length(self) -> int | None:
        """Truncate at what both tokenizer and model allow (tokenizers without a
        limit report a huge ``model_max_length``)."""
        limits = [n for n in (self.tokenizer.model_max_length, self._context_tokens())
                  if n and n < 1_000_000]
        return min(limits) if limits else None


class TextGeneration(_Pretrained):
    """Greedy decoding from a causal language model; see the module docstring."""

    Input: ClassVar[type[GenerationInput]] = GenerationInput
    auto_class: ClassVar[str] = "AutoModelForCausalLM"

    def warmup(self) -> None:
        """Two tokens from a short prompt, so kernels are hot before the first job."""
        self.predict(GenerationInput(prompt="warmup", max_new_tokens=2), lambda done, total: None)

    @staticmethod
    def cost(inputs: GenerationInput) -> float:
        """Relative cost for wait estimates: tokens to generate (the prompt is one pass)."""
        return inputs.max_new_tokens + len(inputs.prompt) / 1000

    def predict(self, inputs: GenerationInput, progress: Progress) -> dict[str, Any]:
        """``{"text": continuation, "tokens": n}``; progress once per new token."""
        import torch
        from transformers import StoppingCriteriaList

        ids = self._prompt_ids(inputs)
        prompt_len = ids.shape[-1]
        with torch.inference_mode():
            out = self.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=inputs.max_new_tokens,
                do_sample=False, num_beams=1,
                stopping_criteria=StoppingCriteriaList(
                    [_progress_criteria(progress, prompt_len, inputs.max_new_tokens)]),
                pad_token_id=self._pad_id())
        new = out[0, prompt_len:]
        return {"text": self.tokenizer.decode(new, skip_special_tokens=True),
                "tokens": int(new.shape[-1])}

    def _pad_id(self) -> int | None:
        """Padding for ``generate``: many causal tokenizers have none and pad with EOS."""
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else self.tokenizer.eos_token_id

    def _prompt_ids(self, inputs: GenerationInput) -> Any:
        """The prompt's token ids on the device, its start cut off if prompt and
        continuation would not fit the model's context."""
        ids = self.tokenizer(inputs.prompt, return_tensors="pt")["input_ids"]
        context = self._context_tokens()
        if context:
            ids = ids[:, -max(1, context - inputs.max_new_tokens):]
        return ids.to(self.device)


def _progress_criteria(progress: Progress, prompt_len: int, total: int) -> Any:
    """A ``StoppingCriteria`` that never stops generation itself but reports each
    new token; what ``progress`` raises propagates out of ``generate``."""
    import torch
    from transformers import StoppingCriteria

    class ReportTokens(StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            progress(min(input_ids.shape[-1] - prompt_len, total), total)
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    return ReportTokens()
