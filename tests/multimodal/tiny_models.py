"""Tiny CLIP, CLAP and ColPali folders built from configs (random weights, a few hundred KB), with the
processor / tokenizer files saved alongside, so the server loads them like real checkpoints."""

from __future__ import annotations

from pathlib import Path

from benchmarks.task_models import bpe_merges as _bpe_merges
from benchmarks.task_models import bytes_to_unicode as _bytes_to_unicode
from benchmarks.task_models import vocab_from as _vocab_from


_WORDS = ["a", "the", "photo", "of", "red", "blue", "green", "circle", "square", "dog", "cat", "sound", "tone"]


def build_clip(out: Path) -> None:
    import torch
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel, CLIPProcessor, CLIPTokenizer

    torch.manual_seed(0)
    chars = _bytes_to_unicode()
    merges = _bpe_merges(_WORDS, suffix="</w>")
    vocab = _vocab_from(chars + [c + "</w>" for c in chars], merges, [])
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=32)
    config = CLIPConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=32,
                         bos_token_id=vocab["<|startoftext|>"], eos_token_id=vocab["<|endoftext|>"],
                         pad_token_id=vocab["<|endoftext|>"]),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=32, patch_size=8),
        projection_dim=16,
    )
    model = CLIPModel(config).eval()
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    model.save_pretrained(out)
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(out)


def build_clap(out: Path) -> None:
    import torch
    from transformers import ClapConfig, ClapFeatureExtractor, ClapModel, ClapProcessor, RobertaTokenizer

    torch.manual_seed(0)
    chars = _bytes_to_unicode()
    merges = _bpe_merges(_WORDS)
    vocab = _vocab_from(chars, merges, ["<s>", "<pad>", "</s>", "<unk>"])
    vocab["<mask>"] = len(vocab)
    tokenizer = RobertaTokenizer(vocab=vocab, merges=merges, model_max_length=32)
    config = ClapConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=40, projection_dim=16,
                         pad_token_id=1, bos_token_id=0, eos_token_id=2),
        audio_config=dict(spec_size=64, num_mel_bins=16, patch_size=4, patch_stride=(4, 4), window_size=4,
                          depths=[1, 1], num_heads=[2, 2], patch_embeds_hidden_size=16, hidden_size=32,
                          projection_dim=16, enable_fusion=False),
        projection_dim=16,
    )
    model = ClapModel(config).eval()
    extractor = ClapFeatureExtractor(feature_size=16, sampling_rate=16000, hop_length=160, max_length_s=1,
                                     fft_window_size=400, frequency_min=50, frequency_max=8000, truncation="rand_trunc", padding="repeatpad")
    model.save_pretrained(out)
    ClapProcessor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(out)


def build_colpali(out: Path) -> None:
    import torch
    from transformers import ColPaliConfig, ColPaliForRetrieval, ColPaliProcessor, GemmaTokenizer
    from transformers import SiglipImageProcessorPil

    torch.manual_seed(0)
    alphabet = ["▁"] + [chr(c) for c in range(33, 127)] + [f"<0x{b:02X}>" for b in range(256)]
    merges = _bpe_merges(["▁" + w for w in _WORDS])
    vocab = _vocab_from(alphabet, merges, ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"])
    tokenizer = GemmaTokenizer(vocab=vocab, merges=merges)
    image_processor = SiglipImageProcessorPil(size={"height": 32, "width": 32})
    image_processor.image_seq_length = (32 // 8) ** 2
    processor = ColPaliProcessor(image_processor=image_processor, tokenizer=tokenizer)
    vocab_size = len(processor.tokenizer)
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>")
    config = ColPaliConfig(
        vlm_config=dict(
            model_type="paligemma",
            text_config=dict(model_type="gemma", vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                             max_position_embeddings=256),
            vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64,
                               num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8,
                               projection_dim=32),
            projection_dim=32, hidden_size=32, image_token_index=image_token, vocab_size=vocab_size,
        ),
        embedding_dim=16,
    )
    model = ColPaliForRetrieval(config).eval()
    model.save_pretrained(out)
    processor.save_pretrained(out)


def build_siglip(out: Path) -> None:
    """SigLIP-style: sigmoid image–text model whose text tower pools the *last* position, so text is
    padded to ``max_length`` (as SigLIP was trained); Gemma-style tokenizer as in SigLIP 2."""
    import torch
    from transformers import GemmaTokenizer, SiglipConfig, SiglipImageProcessorPil, SiglipModel, SiglipProcessor

    torch.manual_seed(0)
    alphabet = ["▁"] + [chr(c) for c in range(33, 127)] + [f"<0x{b:02X}>" for b in range(256)]
    merges = _bpe_merges(["▁" + w for w in _WORDS])
    vocab = _vocab_from(alphabet, merges, ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"])
    tokenizer = GemmaTokenizer(vocab=vocab, merges=merges, model_max_length=16, padding_side="right")
    config = SiglipConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=16, pad_token_id=0),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=32, patch_size=8),
    )
    model = SiglipModel(config).eval()
    model.save_pretrained(out)
    image_processor = SiglipImageProcessorPil(size={"height": 32, "width": 32})
    SiglipProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(out)


def build_siglip2(out: Path) -> None:
    """SigLIP 2 (NaFlex layout: ``Siglip2Model``): images are cut into at most ``max_num_patches`` (256) patches at
    their own aspect ratio, with ``pixel_attention_mask`` and ``spatial_shapes`` beside the pixels; text is
    padded to ``max_length`` as in SigLIP; Gemma-style tokenizer."""
    import torch
    from transformers import GemmaTokenizer, Siglip2Config, Siglip2ImageProcessorPil, Siglip2Model, Siglip2Processor

    torch.manual_seed(0)
    alphabet = ["▁"] + [chr(c) for c in range(33, 127)] + [f"<0x{b:02X}>" for b in range(256)]
    merges = _bpe_merges(["▁" + w for w in _WORDS])
    vocab = _vocab_from(alphabet, merges, ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"])
    tokenizer = GemmaTokenizer(vocab=vocab, merges=merges, model_max_length=16, padding_side="right")
    config = Siglip2Config(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=16, pad_token_id=0),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           num_patches=256, patch_size=16),
    )
    model = Siglip2Model(config).eval()
    model.save_pretrained(out)
    # the published patch size and patch budget (the processor's call defaults to them as well)
    image_processor = Siglip2ImageProcessorPil(patch_size=16, max_num_patches=256)
    Siglip2Processor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(out)
