"""The catalogue's current models (sim/cost/data/models.toml, issue 15 item 4): each is read through the same
HF-config reader as a user's config.json, and its parameter count matches what its publisher states; Hub ids
("org/name") find catalogue entries; an id the catalogue lacks says to pass a config.json, with the nearest names."""

from __future__ import annotations

import json
import tomllib

import pytest

from sim.core.errors import UnknownNameError
from sim.cost.hf_config import load_hf_config
from sim.cost.models import DATA_FILE, SOURCES, get_model, list_models

# (total, non-embedding) in billions, as each model card states them (Qwen3 cards: "Number of Parameters" and
# "(Non-Embedding)"; Meta's Llama cards; Mistral: the safetensors index total_size / 2 bytes; DeepSeek's
# distills: their bases, Qwen2.5-Math-7B 7.62B and Llama-3.1-8B 8.03B), to the digits given.
TOTAL_B = {
    "Qwen3-0.6B": (0.6, 0.44), "Qwen3-1.7B": (1.7, 1.4), "Qwen3-4B": (4.0, 3.6), "Qwen3-8B": (8.2, 6.95),
    "Qwen3-14B": (14.8, 13.2), "Llama-3.2-1B": (1.24, None), "Llama-3.2-3B": (3.21, None),
    "Llama-3.3-70B": (70.55, None), "Mistral-Small-24B-2501": (23.5724032, None),
    "DeepSeek-R1-Distill-Qwen-7B": (7.62, None), "DeepSeek-R1-Distill-Llama-8B": (8.03, None),
}  # fmt: skip
# Gemma 3 technical report, table 1: non-embedding parameters (M); the vision tower (417M) is not modelled.
GEMMA_NON_EMBEDDING_M = {"Gemma-3-4B": 3209, "Gemma-3-12B": 10759, "Gemma-3-27B": 25600}
# gpt-oss model card, table 1: total and active (B); "active" there counts the unembedding, not the embedding.
GPT_OSS_B = {"gpt-oss-20b": (20.91, 3.61), "gpt-oss-120b": (116.83, 5.13)}


def _digits(x: float) -> int:
    return len(repr(x).split(".")[1]) if "." in repr(x) else 0


@pytest.mark.parametrize("name", sorted(TOTAL_B))
def test_dense_models_match_their_published_totals(name):
    m = get_model(name)
    total, non_emb = TOTAL_B[name]
    assert round(m.num_params / 1e9, _digits(total)) == pytest.approx(total, abs=1e-9)
    if non_emb is not None:
        assert round((m.num_params - m.embedding_params) / 1e9, _digits(non_emb)) == pytest.approx(non_emb, abs=1e-9)


def test_mistral_small_is_exactly_its_checkpoint():
    assert get_model("Mistral-Small-24B-2501").num_params == 47_144_806_400 // 2  # bf16 safetensors total_size


@pytest.mark.parametrize("name", sorted(GEMMA_NON_EMBEDDING_M))
def test_gemma3_non_embedding_matches_the_report(name):
    m = get_model(name)
    assert m.tie_word_embeddings and m.qk_norm and m.norms_per_layer == 4 and m.head_dim in (128, 256)
    assert round((m.num_params - m.embedding_params) / 1e6) == pytest.approx(GEMMA_NON_EMBEDDING_M[name], abs=1)


@pytest.mark.parametrize("name", sorted(GPT_OSS_B))
def test_gpt_oss_total_and_active(name):
    m = get_model(name)
    total, active = GPT_OSS_B[name]
    assert m.is_moe and m.experts_per_tok == 4 and m.quantization == "int4"  # MXFP4 experts: 4-bit
    assert round(m.num_params / 1e9, 2) == pytest.approx(total, abs=1e-9)
    embedding = m.vocab_size * m.hidden_size
    assert round((m.num_active_params - embedding) / 1e9, 2) == pytest.approx(active, abs=1e-9)


def test_llama4_scout_text_model():
    m = get_model("Llama-4-Scout-17B-16E")
    assert (m.num_experts, m.experts_per_tok, m.num_shared_experts, m.expert_intermediate_size) == (16, 1, 1, 8192)
    # Meta: "17B active, 109B total" with the vision encoder, which is not modelled: the text model is ~107.8B.
    assert round(m.num_active_params / 1e9) == 17
    assert 107.0 < m.num_params / 1e9 < 109.0


def test_every_data_file_entry_cites_its_source_and_is_listed():
    raw = tomllib.loads(DATA_FILE.read_text(encoding="utf-8"))
    names = [e["name"] for e in raw["model"]]
    assert len(names) == len(set(names)) == 17
    for e in raw["model"]:
        assert e["source"].startswith("https://huggingface.co/") and e.get("quoted")
        assert SOURCES[e["name"]] == e["source"] and e["name"] in list_models()


@pytest.mark.parametrize("hub_id, name", [
    ("Qwen/Qwen3-8B", "Qwen3-8B"), ("google/gemma-3-27b-it", "Gemma-3-27B"),
    ("meta-llama/Llama-3.3-70B-Instruct", "Llama-3.3-70B"), ("openai/gpt-oss-120b", "gpt-oss-120b"),
    ("mistralai/Mistral-Small-24B-Instruct-2501", "Mistral-Small-24B-2501"),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "Llama-4-Scout-17B-16E"),
    ("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "DeepSeek-R1-Distill-Llama-8B"),
])  # fmt: skip
def test_hub_ids_find_catalogue_entries(hub_id, name):
    assert get_model(hub_id).name == name


def test_a_hub_id_not_in_the_catalogue_says_pass_a_config_json():
    with pytest.raises(UnknownNameError) as e:
        get_model("Qwen/Qwen3-235B-A22B")
    msg = str(e.value)
    assert "not in the catalogue; pass a config.json" in msg and "nearest:" in msg and "Qwen3-" in msg
    assert "\n" not in msg


def test_a_downloaded_config_json_is_named_from_name_or_path(tmp_path):
    raw = tomllib.loads(DATA_FILE.read_text(encoding="utf-8"))
    entry = next(e for e in raw["model"] if e["name"] == "gpt-oss-20b")
    folder = tmp_path / "snapshot-abc123"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**entry["config"], "_name_or_path": "openai/gpt-oss-20b"}))
    m = load_hf_config(folder / "config.json")
    assert m.name == "openai/gpt-oss-20b"  # not the folder's name
    assert m.num_params == get_model("gpt-oss-20b").num_params
    multimodal = next(e for e in raw["model"] if e["name"] == "Gemma-3-4B")["config"]
    (folder / "config.json").write_text(json.dumps({**multimodal, "_name_or_path": "google/gemma-3-4b-it"}))
    assert load_hf_config(folder / "config.json").name == "google/gemma-3-4b-it"  # from the wrapper, not text_config
