"""Tiny random-weight Hugging Face models, built from configs with no network.

Each builder seeds torch, builds a model a few kilobytes big with the same
architecture as a real one (sizes as in diffusers' and transformers' own fast
tests), writes its tokenizer from a vocabulary made here, and saves everything
with ``save_pretrained`` into ``dest``: the folder layout the adapters load.
"""
from __future__ import annotations

import json
from pathlib import Path

#: Special tokens of CLIP's and GPT-2's byte-level BPE vocabularies.
CLIP_BOS, CLIP_EOS = "<|startoftext|>", "<|endoftext|>"
#: A word-piece vocabulary: BERT's specials, every letter and digit whole and as a suffix.
WORDPIECE_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def byte_chars() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values (``bytes_to_unicode``):
    a vocabulary holding all of them spells any text, so no prompt is unknown."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = [], 0
    for byte in range(256):
        if byte in printable:
            chars.append(chr(byte))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def write_bpe_vocab(dest: Path, specials: list[str], word_ends: bool) -> int:
    """Write ``vocab.json`` (specials, then one token per byte, and with ``word_ends``
    CLIP's ``</w>`` word-final forms too) and an empty ``merges.txt``; return its size."""
    chars = byte_chars()
    tokens = [*specials, *chars, *([f"{c}</w>" for c in chars] if word_ends else [])]
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (dest / "merges.txt").write_text("#version: 0.2\n")
    return len(tokens)


def build_tiny_diffusion(dest: Path) -> Path:
    """A tiny Stable Diffusion pipeline (UNet, VAE, CLIP text encoder, DDIM), saved in ``dest``."""
    from diffusers import StableDiffusionPipeline
    from transformers import CLIPTokenizer

    scratch = dest.parent / f"{dest.name}-tokenizer"
    vocab_size = write_bpe_vocab(scratch, [CLIP_BOS, CLIP_EOS], word_ends=True)
    tokenizer = CLIPTokenizer(str(scratch / "vocab.json"), str(scratch / "merges.txt"),
                              model_max_length=16)
    pipe = StableDiffusionPipeline(
        unet=_tiny_unet(), vae=_tiny_vae(), text_encoder=_tiny_clip_text(tokenizer, vocab_size),
        tokenizer=tokenizer, scheduler=_tiny_scheduler(), safety_checker=None,
        feature_extractor=None, requires_safety_checker=False)
    pipe.save_pretrained(dest)
    return dest


def _tiny_unet():
    from diffusers import UNet2DConditionModel

    torch_seed(0)
    return UNet2DConditionModel(
        block_out_channels=(4, 8), layers_per_block=1, sample_size=32, in_channels=4,
        out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
        norm_num_groups=2)


def _tiny_vae():
    from diffusers import AutoencoderKL

    torch_seed(0)
    return AutoencoderKL(
        block_out_channels=[4, 8], in_channels=3, out_channels=3, latent_channels=4,
        down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
        norm_num_groups=2)


def _tiny_clip_text(tokenizer, vocab_size: int):
    from transformers import CLIPTextConfig, CLIPTextModel

    torch_seed(0)
    ids = tokenizer.convert_tokens_to_ids
    return CLIPTextModel(CLIPTextConfig(
        bos_token_id=ids(CLIP_BOS), eos_token_id=ids(CLIP_EOS), pad_token_id=ids(CLIP_EOS),
        hidden_size=32, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2,
        layer_norm_eps=1e-5, vocab_size=vocab_size,
        max_position_embeddings=tokenizer.model_max_length))


def _tiny_scheduler():
    from diffusers import DDIMScheduler

    # Stable Diffusion 1.x's schedule, as in diffusers' own fast tests.
    return DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                         clip_sample=False, set_alpha_to_one=False, steps_offset=1)


def build_tiny_bert(dest: Path) -> Path:
    """A tiny BERT encoder and its word-piece tokenizer, saved in ``dest``."""
    from transformers import BertConfig, BertModel, BertTokenizer

    dest.mkdir(parents=True, exist_ok=True)
    pieces = [*"abcdefghijklmnopqrstuvwxyz0123456789.,!?'-"]
    vocab = [*WORDPIECE_SPECIALS, *pieces, *(f"##{p}" for p in pieces)]
    (dest / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizer(str(dest / "vocab.txt"), model_max_length=64).save_pretrained(dest)
    torch_seed(0)
    model = BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=37, vocab_size=len(vocab),
                                 max_position_embeddings=64))
    model.save_pretrained(dest)
    return dest


def build_tiny_gpt2(dest: Path) -> Path:
    """A tiny GPT-2 and its byte-level tokenizer, saved in ``dest``."""
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Tokenizer

    vocab_size = write_bpe_vocab(dest, [CLIP_EOS], word_ends=False)
    GPT2Tokenizer(str(dest / "vocab.json"), str(dest / "merges.txt"),
                  model_max_length=64).save_pretrained(dest)
    torch_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_positions=64, n_embd=32,
                                       n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0))
    model.save_pretrained(dest)
    return dest


def torch_seed(seed: int) -> None:
    """Seed torch's CPU generator, so that the same builder makes the same weights."""
    import torch

    torch.manual_seed(seed)
