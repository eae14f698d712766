"""Reading a recipe's YAML (or JSON) text within bounds: an alias bomb, a file too large or nested too deep is
refused with the reason, at once and without building what it would expand to; anchors within bounds still work."""

import json
import time
from pathlib import Path

import pytest

import training
from training.recipe import (MAX_RECIPE_CHARS, MAX_RECIPE_DEPTH, MAX_RECIPE_VALUES, RecipeError, load_recipe,
                             parse_recipe_text)

EXAMPLES = Path(training.__file__).resolve().parent / "examples"


def billion_laughs(levels: int = 9) -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        here, before = chr(ord("a") + i), chr(ord("a") + i - 1)
        lines.append(f"{here}: &{here} [{', '.join(f'*{before}' for _ in range(9))}]")
    return "\n".join(lines) + "\n"


def test_it_refuses_a_billion_laughs_at_once():
    started = time.perf_counter()
    with pytest.raises(RecipeError, match=f"aliases expand to more than {MAX_RECIPE_VALUES:,} values"):
        parse_recipe_text(billion_laughs())  # 9**9: about 387 million strings
    assert time.perf_counter() - started < 1.0


def test_it_refuses_a_bomb_hidden_in_a_recipe_file(tmp_path):
    recipe = (EXAMPLES / "tiny.yaml").read_text() + "extra:\n" + "".join(
        f"  {line}\n" for line in billion_laughs(7).splitlines())
    (tmp_path / "r.yaml").write_text(recipe)
    with pytest.raises(RecipeError, match=r"r\.yaml: the recipe's aliases expand"):
        load_recipe(tmp_path / "r.yaml")


def test_it_refuses_an_anchor_that_holds_itself():
    with pytest.raises(RecipeError, match=r"the alias \*loop names no finished anchor"):
        parse_recipe_text("phases: &loop [*loop]\n")


def test_it_refuses_nesting_too_deep_in_yaml_and_json():
    deep = "[" * (MAX_RECIPE_DEPTH + 1) + "]" * (MAX_RECIPE_DEPTH + 1)
    for as_json in (False, True):
        with pytest.raises(RecipeError, match=f"nests more than {MAX_RECIPE_DEPTH} levels deep"):
            parse_recipe_text(deep, as_json=as_json)
    very_deep = "[" * 100_000 + "]" * 100_000  # past the interpreter's recursion limit
    for as_json in (False, True):
        with pytest.raises(RecipeError, match="nest"):
            parse_recipe_text(very_deep, as_json=as_json)
    ok = "[" * MAX_RECIPE_DEPTH + "]" * MAX_RECIPE_DEPTH
    assert parse_recipe_text(ok) == parse_recipe_text(ok, as_json=True)


def test_it_refuses_text_past_the_size_limit():
    with pytest.raises(RecipeError, match=f"at most {MAX_RECIPE_CHARS:,} are read"):
        parse_recipe_text("# padding\n" * (MAX_RECIPE_CHARS // 10 + 1))


def test_it_still_reads_anchors_and_merge_keys_within_bounds():
    text = ("defaults: &sft {kind: sft, steps: 10, lr: 1.0e-4}\n"
            "phases:\n  - {<<: *sft, name: first, data: a.jsonl}\n  - {<<: *sft, name: second, data: b.jsonl}\n")
    recipe = parse_recipe_text(text)
    assert [p["name"] for p in recipe["phases"]] == ["first", "second"]
    assert all(p["kind"] == "sft" and p["steps"] == 10 for p in recipe["phases"])
    example = parse_recipe_text((EXAMPLES / "tiny.yaml").read_text())
    assert parse_recipe_text(json.dumps(example), as_json=True) == example
