"""Tiny vision-language configs (hidden 32, 2 layers, 16×16 images in 8×8 patches) and
their inputs, shared by the interop and command-line tests."""

import torch
import transformers as T

TEXT = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)
VISION = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              image_size=16, patch_size=8)
IMAGE_TOKEN = 95


def llava():
    cfg = T.LlavaConfig(text_config=T.LlamaConfig(**TEXT),
                        vision_config=T.CLIPVisionConfig(**VISION, projection_dim=32),
                        image_token_index=IMAGE_TOKEN, vision_feature_layer=-1)
    return T.LlavaForConditionalGeneration, cfg, {}


def gemma3():
    cfg = T.Gemma3Config(text_config=T.Gemma3TextConfig(**TEXT, head_dim=8),
                         vision_config=T.SiglipVisionConfig(**VISION), mm_tokens_per_image=4,
                         image_token_index=IMAGE_TOKEN, boi_token_index=93, eoi_token_index=94)
    return T.Gemma3ForConditionalGeneration, cfg, {}


def paligemma():
    cfg = T.PaliGemmaConfig(text_config=T.GemmaConfig(**TEXT, head_dim=8),
                            vision_config=T.SiglipVisionConfig(**VISION, projection_dim=32),
                            projection_dim=32, image_token_index=IMAGE_TOKEN)
    return T.PaliGemmaForConditionalGeneration, cfg, {}


def mistral3():
    cfg = T.Mistral3Config(text_config=T.MistralConfig(**TEXT, head_dim=8),
                           vision_config=T.PixtralVisionConfig(**VISION, head_dim=8),
                           image_token_index=IMAGE_TOKEN, spatial_merge_size=1,
                           vision_feature_layer=-1)
    return T.Mistral3ForConditionalGeneration, cfg, {"image_sizes": torch.tensor([[16, 16]])}


FAMILIES = {"llava": llava, "gemma3": gemma3, "paligemma": paligemma, "mistral3": mistral3}
# the inner model class each family's root wraps, found by class name → LlavaModel
INNER = {"llava": "LlavaModel", "gemma3": "Gemma3Model", "paligemma": "PaliGemmaModel",
         "mistral3": "Mistral3Model"}


def inputs(extra: dict) -> dict:
    """Four image tokens (a 16×16 image in 8×8 patches) and some text."""
    torch.manual_seed(1)
    ids = torch.tensor([[1] + [IMAGE_TOKEN] * 4 + [5, 9, 14, 2]])
    return {"input_ids": ids, "pixel_values": torch.randn(1, 3, 16, 16), **extra}
