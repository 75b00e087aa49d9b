"""The build-convention matrix: a tiny config and inputs per family, the three ways people
build an empty model, and a per-session cache of saved checkpoints and reference models."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import torch
import transformers as T

import weightplan
from tests.interop import families as vlm

TEXT = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)
MOE = dict(TEXT, num_experts_per_tok=2)
IDS = torch.tensor([[1, 5, 9, 14, 2]])


def _text(cls, cfg_cls, **extra):
    return lambda: (cls, cfg_cls(**{**TEXT, **extra}), {"input_ids": IDS})


def _bert():
    cfg = T.BertConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, max_position_embeddings=16)
    return T.BertForMaskedLM, cfg, {"input_ids": IDS}


def _t5():
    cfg = T.T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
                     decoder_start_token_id=0, tie_word_embeddings=True)
    return T.T5ForConditionalGeneration, cfg, {"input_ids": IDS, "decoder_input_ids": IDS[:, :3]}


def _whisper():
    cfg = T.WhisperConfig(vocab_size=96, d_model=32, encoder_layers=2, decoder_layers=2,
                          encoder_attention_heads=4, decoder_attention_heads=4,
                          encoder_ffn_dim=48, decoder_ffn_dim=48, num_mel_bins=8,
                          max_source_positions=8, max_target_positions=16,
                          decoder_start_token_id=1, pad_token_id=0, eos_token_id=2,
                          bos_token_id=1, suppress_tokens=None, begin_suppress_tokens=None)
    torch.manual_seed(2)
    feats = torch.randn(1, 8, 16)
    return (T.WhisperForConditionalGeneration, cfg,
            {"input_features": feats, "decoder_input_ids": IDS[:, :3]})


def _clip():
    text = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=16)
    cfg = T.CLIPConfig(text_config=text, vision_config=dict(vlm.VISION), projection_dim=16)
    torch.manual_seed(1)
    return T.CLIPModel, cfg, {"input_ids": IDS, "pixel_values": torch.randn(1, 3, 16, 16)}


def _deepseek_v3():
    cfg = T.DeepseekV3Config(**{**MOE, "num_attention_heads": 4, "num_key_value_heads": 4},
                             moe_intermediate_size=8, n_routed_experts=4, n_shared_experts=1,
                             first_k_dense_replace=1, kv_lora_rank=8, q_lora_rank=8,
                             qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, n_group=1,
                             topk_group=1)
    return T.DeepseekV3ForCausalLM, cfg, {"input_ids": IDS}


def _vlm(name):
    def build():
        cls, cfg, extra = vlm.FAMILIES[name]()
        return cls, cfg, vlm.inputs(extra)
    return build


FAMILIES: dict[str, Callable] = {
    "llama": _text(T.LlamaForCausalLM, T.LlamaConfig),
    "qwen2": _text(T.Qwen2ForCausalLM, T.Qwen2Config),
    "gemma2": _text(T.Gemma2ForCausalLM, T.Gemma2Config, head_dim=8, tie_word_embeddings=True),
    "phi3": _text(T.Phi3ForCausalLM, T.Phi3Config, pad_token_id=0),
    "mistral": _text(T.MistralForCausalLM, T.MistralConfig, head_dim=8),
    "bert": _bert,
    "t5": _t5,
    "whisper": _whisper,
    "clip": _clip,
    "qwen2_moe": _text(T.Qwen2MoeForCausalLM, T.Qwen2MoeConfig, moe_intermediate_size=8,
                       shared_expert_intermediate_size=8, num_experts=4, num_experts_per_tok=2),
    "qwen3_moe": _text(T.Qwen3MoeForCausalLM, T.Qwen3MoeConfig, moe_intermediate_size=8,
                       num_experts=4, num_experts_per_tok=2, head_dim=8),
    "mixtral": _text(T.MixtralForCausalLM, T.MixtralConfig, num_local_experts=4,
                     num_experts_per_tok=2),
    "phimoe": _text(T.PhimoeForCausalLM, T.PhimoeConfig, num_local_experts=4,
                    num_experts_per_tok=2),
    "llava": _vlm("llava"),
    "gemma3": _vlm("gemma3"),
    "paligemma": _vlm("paligemma"),
    "mistral3": _vlm("mistral3"),
    "deepseek_v3": _deepseek_v3,
}


def _accelerate():
    from accelerate import init_empty_weights

    return init_empty_weights()


BUILDS: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "init_empty": weightplan.init_empty,
    "accelerate": _accelerate,
    "meta": lambda: torch.device("meta"),
}


def build(cls, cfg, convention: str) -> torch.nn.Module:
    with BUILDS[convention]():
        return cls(cfg).eval()


def output(model, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        out = model(**inputs)
    return out.logits if getattr(out, "logits", None) is not None else out.logits_per_image


def pretrained(cls, directory, **kwargs) -> torch.nn.Module:
    """``from_pretrained``, its tensors copied into memory of their own, as a load gives
    (mapped file memory is unaligned, and CLIP's logits then move by one ulp)."""
    model = cls.from_pretrained(directory, **kwargs).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.clone()
    return model


class Saved:
    """One family saved by ``save_pretrained`` and loaded back by ``from_pretrained``."""

    def __init__(self, name: str, root: Path):
        self.cls, self.cfg, self.inputs = FAMILIES[name]()
        self.directory = root / name
        torch.manual_seed(0)
        self.cls(self.cfg).save_pretrained(self.directory)
        self.reference = pretrained(self.cls, self.directory, dtype=torch.float32)
        self.expected = output(self.reference, self.inputs)
