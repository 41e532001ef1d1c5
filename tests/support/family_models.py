"""Tiny model folders of the families users bring, saved the way their published repositories are: built
from a config with transformers, written by sentence-transformers' ``save`` (or ``save_pretrained``), with
the real all-MiniLM-L6-v2 tokenizer where the family's own tokenizer does not matter to the numbers.
Builders take the output folder (see ``tests/support/cache.py`` ``cached_build``)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from tests.support.text_models import _copy_tokenizer

#: prompts saved in config_sentence_transformers.json (a query prompt and an empty document prompt)
PROMPTS = {"query": "query: ", "document": ""}


def _dense(torch, models, in_features: int, out_features: int, *, bias: bool, activation):
    dense = models.Dense(in_features, out_features, bias=bias, activation_function=activation)
    with torch.no_grad():  # a wide init, so the projection changes the vectors clearly
        dense.linear.weight.normal_(0, 1.5 / in_features ** 0.5)
    return dense


# --- T5 encoders (sentence-t5 / GTR layout) -----------------------------------------------------------------

def build_t5_encoder(minilm: Path, out: Path) -> None:
    """sentence-t5 / GTR: a T5 encoder (``T5EncoderModel``, config ``model_type: t5``) → mean Pooling → Dense
    (no bias, Identity) → Normalize, saved by sentence-transformers, with a query prompt."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(41)
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp)
        config = T5Config(vocab_size=30522, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                          relative_attention_num_buckets=8, relative_attention_max_distance=32,
                          pad_token_id=0, eos_token_id=102, decoder_start_token_id=0, initializer_factor=1.0)
        T5EncoderModel(config).eval().save_pretrained(hf)
        _copy_tokenizer(minilm, hf)
        transformer = models.Transformer(str(hf), max_seq_length=128)
        dense = _dense(torch, models, 32, 24, bias=False, activation=torch.nn.Identity())
        st = SentenceTransformer(modules=[transformer, models.Pooling(32, pooling_mode="mean"), dense,
                                          models.Normalize()], device="cpu")
        st.prompts = dict(PROMPTS)
        st.save(str(out))


# --- custom code (jina-embeddings-v3 layout: built-in model_type xlm-roberta, auto_map to its own code) -------

#: jina-embeddings-v3's LoRA tasks, in its config's order (``lora_adaptations``)
JINA_TASKS = ["retrieval.query", "retrieval.passage", "separation", "classification", "text-matching"]
#: its task prompts (config_sentence_transformers.json), shortened
JINA_PROMPTS = {"retrieval.query": "Represent the query: ", "retrieval.passage": "Represent the document: ",
                "separation": "", "classification": "", "text-matching": ""}

#: the model's own code, as jina-embeddings-v3 ships it in spirit: a wrapper whose ``forward(*args, **kwargs)``
#: passes everything to an XLM-R encoder whose output goes through a low-rank adapter per task, chosen per row by
#: ``adapter_mask`` (task indices; the default task when absent)
JINA_STYLE_CODE = '''\
import torch
from transformers import XLMRobertaConfig, XLMRobertaModel, XLMRobertaPreTrainedModel
from transformers.modeling_outputs import BaseModelOutput


class AdapterXLMRobertaModel(XLMRobertaModel):
    """The encoder with a low-rank adapter per task on its output, chosen per row by adapter_mask."""

    def __init__(self, config):
        super().__init__(config, add_pooling_layer=False)
        tasks, rank, hidden = len(config.lora_adaptations), config.lora_rank, config.hidden_size
        self.lora_A = torch.nn.Parameter(torch.zeros(tasks, hidden, rank))
        self.lora_B = torch.nn.Parameter(torch.zeros(tasks, rank, hidden))

    def forward(self, input_ids=None, attention_mask=None, adapter_mask=None, **kwargs):
        hidden = super().forward(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if adapter_mask is None:
            default = self.config.lora_adaptations.index(self.config.default_lora_task)
            adapter_mask = torch.full((hidden.shape[0],), default, dtype=torch.long, device=hidden.device)
        a, b = self.lora_A[adapter_mask], self.lora_B[adapter_mask]
        return BaseModelOutput(last_hidden_state=hidden + torch.tanh(hidden @ a) @ b)


class LoRAXLMRoberta(XLMRobertaPreTrainedModel):
    """What AutoModel loads: a wrapper whose forward passes everything to the encoder, as jina-embeddings-v3's."""

    config_class = XLMRobertaConfig
    base_model_prefix = "roberta"

    def __init__(self, config):
        super().__init__(config)
        self.roberta = AdapterXLMRobertaModel(config)
        self.post_init()

    def forward(self, *args, **kwargs):
        return self.roberta(*args, **kwargs)
'''


def _import_file(path: Path, name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_jina_style(minilm: Path, out: Path) -> None:
    """A tiny XLM-R whose config.json keeps ``model_type: xlm-roberta`` and maps ``AutoModel`` to its own code
    (``modeling_lora.LoRAXLMRoberta``, written beside it), with task adapters that change every vector; saved
    by sentence-transformers (Transformer → mean Pooling → Normalize) with task prompts."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import XLMRobertaConfig

    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp)
        (hf / "modeling_lora.py").write_text(JINA_STYLE_CODE)
        code = _import_file(hf / "modeling_lora.py", "tessera_test_modeling_lora")
        config = XLMRobertaConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=514, pad_token_id=1,
                                  bos_token_id=101, eos_token_id=102, type_vocab_size=1, initializer_range=0.2,
                                  lora_adaptations=JINA_TASKS, lora_rank=4, default_lora_task="text-matching")
        config.auto_map = {"AutoModel": "modeling_lora.LoRAXLMRoberta"}
        torch.manual_seed(51)
        model = code.LoRAXLMRoberta(config).eval()
        with torch.no_grad():
            model.roberta.lora_A.normal_(0, 0.6)
            model.roberta.lora_B.normal_(0, 0.6)
        model.save_pretrained(hf)
        _copy_tokenizer(minilm, hf)
        transformer = models.Transformer(str(hf), max_seq_length=128, model_kwargs={"trust_remote_code": True},
                                         config_kwargs={"trust_remote_code": True})
        assert type(transformer.auto_model).__name__ == "LoRAXLMRoberta"
        st = SentenceTransformer(modules=[transformer, models.Pooling(32, pooling_mode="mean"), models.Normalize()],
                                 device="cpu")
        st.prompts = dict(JINA_PROMPTS)
        st.save(str(out))
    if not (out / "modeling_lora.py").exists():  # the code travels with the model, as in its repository
        (out / "modeling_lora.py").write_text(JINA_STYLE_CODE)
    import json

    config = json.loads((out / "config.json").read_text())
    config["architectures"] = ["XLMRobertaModel"]  # as jina-embeddings-v3's config says
    (out / "config.json").write_text(json.dumps(config, indent=2))


def build_nomic_style(minilm: Path, out: Path) -> None:
    """NomicBert's layout: ``model_type: nomic_bert`` (no transformers class) with ``auto_map`` naming code in
    another Hub repository (``nomic-ai/nomic-bert-2048--…``), which an offline machine does not have."""
    import json

    from tests.support.text_models import build_tiny_bert

    build_tiny_bert(minilm, out)
    config = json.loads((out / "config.json").read_text())
    config.update(model_type="nomic_bert", architectures=["NomicBertModel"], auto_map={
        "AutoConfig": "nomic-ai/nomic-bert-2048--configuration_hf_nomic_bert.NomicBertConfig",
        "AutoModel": "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel"})
    (out / "config.json").write_text(json.dumps(config, indent=2))


# --- Gemma 3 embedders (EmbeddingGemma layout) ---------------------------------------------------------------

#: EmbeddingGemma's prompts (config_sentence_transformers.json), a subset
GEMMA_PROMPTS = {"query": "task: search result | query: ", "document": "title: none | text: ",
                 "Clustering": "task: clustering | query: "}


def build_gemma_tokenizer(out: Path) -> None:
    """A byte-level BPE trained on the test sentences with Gemma's special tokens (<pad> = 0, <eos>, <bos>),
    adding <bos> before and <eos> after each text as EmbeddingGemma's tokenizer does; pads on the right."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from tests.support.sentences import SENTENCES

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(SENTENCES) + list(GEMMA_PROMPTS.values()), trainer)
    bos, eos = tok.token_to_id("<bos>"), tok.token_to_id("<eos>")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A <eos>", pair="<bos> $A <eos> $B <eos>",
                                                       special_tokens=[("<bos>", bos), ("<eos>", eos)])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
        "pad_token": "<pad>", "unk_token": "<unk>", "padding_side": "right", "model_max_length": 2048}))


def build_embedding_gemma(out: Path) -> None:
    """EmbeddingGemma: ``Gemma3TextModel`` with bidirectional attention (sliding and full layers; a short
    sliding window, so the test texts cross it) → mean Pooling → Dense (up) → Dense (down) → Normalize, with
    query/document prompts; saved by sentence-transformers."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from tokenizers import Tokenizer
    from transformers import Gemma3TextConfig, Gemma3TextModel

    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp)
        build_gemma_tokenizer(hf)
        vocab = Tokenizer.from_file(str(hf / "tokenizer.json")).get_vocab_size()
        torch.manual_seed(61)
        config = Gemma3TextConfig(
            vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=2048, sliding_window=8,
            layer_types=["sliding_attention", "full_attention"], use_bidirectional_attention=True,
            query_pre_attn_scalar=8, pad_token_id=0, eos_token_id=1, bos_token_id=2, initializer_range=0.2,
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}})
        model = Gemma3TextModel(config).eval()
        model.save_pretrained(hf)
        transformer = models.Transformer(str(hf), max_seq_length=256)
        modules = [transformer, models.Pooling(32, pooling_mode="mean"),
                   _dense(torch, models, 32, 96, bias=False, activation=torch.nn.Identity()),
                   _dense(torch, models, 96, 24, bias=False, activation=torch.nn.Identity()), models.Normalize()]
        st = SentenceTransformer(modules=modules, device="cpu")
        st.prompts = dict(GEMMA_PROMPTS)
        st.save(str(out))


# --- Stanford ColBERT checkpoints (HF_ColBERT layout: colbert-ir/colbertv2.0, answerai-colbert-small-v1) -----

#: variant → (artifact.metadata settings, weights as pytorch_model.bin)
STANFORD_COLBERTS = {
    # colbertv2.0: pytorch_model.bin, [MASK] expansions not attended
    "colbertv2": ({"query_maxlen": 16, "doc_maxlen": 48, "dim": 16, "attend_to_mask_tokens": False,
                   "mask_punctuation": True}, True),
    # a safetensors checkpoint whose queries attend to their [MASK] expansions
    "attend-masks": ({"query_maxlen": 20, "doc_maxlen": 64, "dim": 12, "attend_to_mask_tokens": True,
                      "mask_punctuation": True}, False),
}


def build_stanford_colbert(minilm: Path, out: Path, *, variant: str) -> None:
    """A Stanford ColBERT checkpoint as ColBERT's ``HF_ColBERT.save_pretrained`` writes it: config.json with
    ``architectures: ["HF_ColBERT"]`` (model_type bert), one weight file holding ``bert.*`` and the projection
    ``linear.weight`` (dim × hidden, no bias), ``artifact.metadata`` with ColBERT's settings; the MiniLM
    (BERT uncased) tokenizer, which has ColBERT's [unused0]/[unused1] markers and [MASK]."""
    import json

    import torch
    from safetensors.torch import save_file
    from transformers import BertModel

    from tests.support.text_models import _bert_config

    meta, as_bin = STANFORD_COLBERTS[variant]
    torch.manual_seed(71 + len(variant))
    config = _bert_config(initializer_range=0.1)
    bert = BertModel(config).eval()
    state = {f"bert.{k}": v.contiguous() for k, v in bert.state_dict().items()}
    state["linear.weight"] = torch.randn(meta["dim"], 32) * 0.3
    config.architectures = ["HF_ColBERT"]
    config.save_pretrained(out)
    if as_bin:
        torch.save(state, out / "pytorch_model.bin")
    else:
        save_file(state, str(out / "model.safetensors"))
    _copy_tokenizer(minilm, out)
    (out / "artifact.metadata").write_text(json.dumps({
        "query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_token": "[Q]", "doc_token": "[D]",
        "similarity": "cosine", "nbits": 2, "checkpoint": "colbert-ir/colbertv2.0", **meta}, indent=4))
