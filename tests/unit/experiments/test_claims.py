"""Claims decided from kept inputs: the figures are the kept samples' means, each relation and
verdict as documented, bad claim files are one line, and the results document in docs/ is what
the kept records give."""

from __future__ import annotations

import json
import re
import sys

import pytest

from gradleak.errors import GradleakError
from gradleak.evaluation.metrics import paper_scores, strict_scores
from gradleak.experiments.claim_files import read_claims
from gradleak.experiments.claims import evaluate, gpu_plan
from gradleak.experiments.grid import expand
from gradleak.experiments.spec import read_experiment
from gradleak.reports.claims import render_results
from tests.helpers import ROOT

REFERENCES = ["the cat sat on the mat", "a dog ran in the park"]
EXPERIMENT = """\
name: toy
kept: kept
published: published.yaml
fixed: {model: tiny-bert, dataset: demo, n_inputs: 2, steps: 10}
axes:
  attack: [tag, lamp-cos]
  batch_size: [1, 2]
cell_name: "{attack}-B{batch_size}"
"""
PUBLISHED = """\
source: a paper
figures:
  - {where: {attack: tag, batch_size: 1}, rouge1: 90.0}
"""


def sample(index: int, reference: str, prediction: str) -> dict:
    return {
        "index": index,
        "reference": [reference],
        "prediction": [prediction],
        "exact": [reference == prediction],
        "strict": strict_scores([prediction], [reference]).to_dict(),
        "paper": paper_scores([prediction], [reference]).to_dict(),
        "labels": [0],
        "attack_s": 1.0,
    }


@pytest.fixture
def toy(tmp_path):
    """An experiment whose TAG cells recovered everything, LAMP_cos at B=1 half of each
    sentence, and LAMP_cos at B=2 one input, refused."""
    (tmp_path / "exp.yaml").write_text(EXPERIMENT)
    (tmp_path / "published.yaml").write_text(PUBLISHED)
    (tmp_path / "kept").mkdir()
    predictions = {"tag-B1": REFERENCES, "tag-B2": REFERENCES,
                   "lamp-cos-B1": ["the cat sat", "a dog ran"]}  # fmt: skip
    for cell in expand(read_experiment(tmp_path / "exp.yaml")):
        lines = [{"config": cell.config.identity(), "device": "cpu"}]
        lines += [
            sample(i, r, p)
            for i, (r, p) in enumerate(
                zip(REFERENCES, predictions.get(cell.name, []), strict=False)
            )
        ]
        if cell.name == "lamp-cos-B2":
            lines.append({"index": 0, "error": "refused: over the rank", "attack_s": 0.1})
        path = tmp_path / "kept" / f"{cell.name}.json.partial.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return tmp_path


def halves_rouge1() -> float:
    """LAMP_cos-B1's strict ROUGE-1, computed here from its texts."""
    halves = ["the cat sat", "a dog ran"]
    scores = [
        strict_scores([p], [r]).means["rouge1"] for p, r in zip(halves, REFERENCES, strict=True)
    ]
    return sum(scores) / len(scores)


def claims(folder, checks: str, missing: str = "") -> list:
    """Evaluate a one-claim file on the toy experiment: ``checks`` one YAML list item a line,
    ``missing`` the claim's ``missing:`` line."""
    head = ["paper: A 2024", "seed: 'A 2024, \"a paper\"'", "claims:", "  - id: one",
            "    table: Table 1", "    claim: something", "    experiment: exp.yaml",
            "    checks:"]  # fmt: skip
    body = ["      " + line.strip() for line in checks.strip().splitlines()]
    tail = ["    " + missing.strip()] if missing else []
    path = folder / "claims.yaml"
    path.write_text("\n".join([*head, *body, *tail]) + "\n")
    return evaluate(path)


def test_figures_are_the_kept_inputs_means_and_the_verdict_follows(toy):
    check = ("- {metric: strict.rouge1, left: {attack: tag}, relation: greater,"
             " right: {attack: lamp-cos}, per: [batch_size]}")  # fmt: skip
    [result] = claims(toy, check)
    b1, b2 = result.outcomes
    assert b1.where == {"batch_size": 1}
    assert (b1.left, b1.right, b1.holds) == (100.0, pytest.approx(halves_rouge1()), True)
    assert (b2.left, b2.right, b2.holds) == (100.0, None, None)  # lamp-cos-B2: no scores
    assert result.verdict == "in part"
    assert [c.cell.name for c in result.cells] == ["tag-B1", "tag-B2", "lamp-cos-B1", "lamp-cos-B2"]
    assert [c.done for c in result.cells] == [2, 2, 2, 1]
    assert [c.refused for c in result.cells] == [0, 0, 0, 1]


def test_verdicts(toy):
    compare = (
        "- {{metric: strict.rouge1, left: {{cell: {}}}, relation: greater, right: {{cell: {}}}}}"
    )
    holds = compare.format("tag-B1", "lamp-cos-B1")
    fails = compare.format("lamp-cos-B1", "tag-B1")
    unmeasured = (
        "- {metric: strict.rouge1, left: {cell: lamp-cos-B2}, relation: at_least, value: 1}"
    )
    assert claims(toy, holds)[0].verdict == "reproduced"
    assert claims(toy, fails)[0].verdict == "refuted"
    assert claims(toy, f"{holds}\n{fails}")[0].verdict == "in part"
    assert claims(toy, f"{holds}\n{unmeasured}")[0].verdict == "in part"
    assert claims(toy, unmeasured)[0].verdict == "not measured"
    missing = "  missing: [another dataset]"
    assert claims(toy, holds, missing)[0].verdict == "in part"


@pytest.mark.parametrize(
    ("relation", "value", "right", "holds"),
    [
        ("times", 1.5, "{cell: lamp-cos-B1}", True),
        ("times", 100, "{cell: lamp-cos-B1}", False),
        ("within", 1, "{cell: tag-B2}", True),
        ("within", 1, "{cell: lamp-cos-B1}", False),
        ("at_most", 99, None, False),
        ("at_least_published", 0, None, True),  # 100 against the paper's 90
    ],
)
def test_relations(toy, relation, value, right, holds):
    side = "" if right is None else f", right: {right}"
    check = (f"- {{metric: paper.rouge1, left: {{cell: tag-B1}}, relation: {relation},"
             f" value: {value}{side}}}")  # fmt: skip
    [outcome] = claims(toy, check)[0].outcomes
    assert outcome.holds is holds
    if relation == "at_least_published":
        assert outcome.right == 90.0


def test_a_list_matches_any_of_its_values_and_best_takes_a_sides_best_cell(toy):
    """LAMP_cos-B1 recovered half of each sentence, TAG-B1 all: the mean over both cells sits
    between them, the best of them is TAG's."""
    both = "{attack: [tag, lamp-cos], batch_size: 1}"
    mean = f"- {{metric: strict.rouge1, left: {both}, relation: at_least, value: 0}}"
    [outcome] = claims(toy, mean)[0].outcomes
    assert [c.cell.name for c in outcome.left_cells] == ["tag-B1", "lamp-cos-B1"]
    assert outcome.left == pytest.approx((100.0 + halves_rouge1()) / 2)
    # the better of (TAG, LAMP_cos) at B=1 against the better of LAMP_cos at B=1 and B=2
    best = (f"- {{metric: strict.rouge1, left: {both}, relation: greater,"
            " right: {attack: lamp-cos}, best: true}")  # fmt: skip
    results = claims(toy, best)
    [outcome] = results[0].outcomes
    assert (outcome.left, outcome.right) == (100.0, pytest.approx(halves_rouge1()))
    assert outcome.holds is True and not outcome.whole  # lamp-cos-B2 has no scores
    text = render_results(results, lambda path: "v1", toy, "make it")
    assert ("`strict.rouge1`: the best of (attack=tag or lamp-cos, batch_size=1) > "
            "the best of (attack=lamp-cos)") in text  # fmt: skip


@pytest.mark.parametrize(
    ("check", "problem"),
    [
        ("{metric: rouge1, left: {attack: tag}, relation: at_least, value: 1}", "is none of"),
        (
            "{metric: paper.exact_match, left: {attack: tag}, relation: at_least, value: 1}",
            "strict.exact_match",
        ),
        (
            "{metric: strict.rouge1, left: {attack: tag}, relation: times, right: {attack: dlg}}",
            "times needs a value",
        ),
        ("{metric: strict.rouge1, left: {attack: tag}, relation: greater}", "give right"),
        ("{metric: strict.rouge1, left: {attack: tag}, relation: nearly, value: 1}", "relation"),
    ],
)
def test_bad_claim_files_are_one_line_naming_the_place(toy, check, problem):
    path = toy / "bad.yaml"
    path.write_text(f"paper: A\nseed: A\nclaims:\n  - id: x\n    table: T\n    claim: c\n"
                    f"    experiment: exp.yaml\n    checks:\n      - {check}\n")  # fmt: skip
    with pytest.raises(GradleakError) as error:
        read_claims(path)
    message = str(error.value)
    assert "\n" not in message and "bad.yaml:" in message and problem in message


def test_the_document_names_each_cell_and_says_where_versions_mix(toy):
    check = (
        "- {metric: strict.rouge1, left: {attack: tag}, relation: greater, right: {attack: dlg}}"
    )
    results = claims(toy, check.replace("dlg", "lamp-cos"))
    text = render_results(results, lambda path: path.name[:5], toy, "make it")
    # lamp-cos-B2 unscored (its one input refused); of the 4 cells' 8 inputs, 7 kept
    assert "| A 2024 | Table 1 | `one` | **in part** | 1 / 1 / 1 | 7 / 8 |" in text
    assert f"| all | 100.0 | {halves_rouge1():.1f} | yes (a cell has no scores) |" in text
    assert "| tag-B1 | 2 of 2 | 10 | cpu | tag-B |" in text
    assert "| lamp-cos-B2 | 1 of 2 (1 refused) | 10 | cpu | lamp- |" in text
    assert "- lamp-cos-B2, 1 of 1: refused: over the rank" in text  # why, in the attack's words
    assert "**Mixed code versions**" in text
    same = render_results(results, lambda path: "v1", toy, "make it")
    assert "One code version for the whole table: v1." in same


def test_a_cell_names_the_code_its_inputs_recorded_and_a_resumed_cell_each(toy):
    """Inputs that record their code name it; a cell resumed on other code names both, and
    inputs kept before the code was recorded fall back to the kept file's version."""
    path = toy / "kept" / "tag-B1.json.partial.jsonl"
    header, first, second = path.read_text().splitlines()
    codes = ["0.2.0+g1111111111", "0.2.0+g2222222222.changed"]
    lines = [header] + [
        json.dumps(json.loads(line) | {"code": code})
        for line, code in zip([first, second], codes, strict=True)
    ]
    path.write_text("\n".join(lines) + "\n")
    tag_b2 = toy / "kept" / "tag-B2.json.partial.jsonl"
    header, first, second = tag_b2.read_text().splitlines()
    tag_b2.write_text("\n".join([header, json.dumps(json.loads(first) | {"code": codes[0]}),
                                 second]) + "\n")  # fmt: skip
    check = "- {metric: strict.rouge1, left: {attack: tag}, relation: at_least, value: 0}"
    text = render_results(claims(toy, check), lambda path: "kept at v0", toy, "make it")
    assert (
        "| tag-B1 | 2 of 2 | 10 | cpu | ran at 1111111111, ran at 2222222222 with changes |" in text
    )
    assert "| tag-B2 | 2 of 2 | 10 | cpu | ran at 1111111111, kept at v0 |" in text
    assert "**Mixed code versions**" in text


def test_the_results_document_is_what_the_kept_records_give():
    """docs/claims.md regenerated from the claim files and benchmarks/kept (the code
    versions aside, which come from git's history of the kept files)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import results
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    code = re.compile(r"kept at [0-9a-f]+|uncommitted|unknown")
    committed = (ROOT / "docs" / "claims.md").read_text(encoding="utf-8")
    assert code.sub("CODE", results.document()) == code.sub("CODE", committed), (
        "docs/claims.md is out of date: run python benchmarks/results.py"
    )


def test_a_claims_gpu_file_is_listed_with_its_cost(toy):
    """A claim's ``gpu:`` file is listed with its cells, inputs and cost: below one CPU core's
    for the stacked optimization attacks, the CPU's for an attack not measured on a GPU."""
    (toy / "gpu.yaml").write_text(
        "name: gpu_toy\ndescription: the paper's size\n"
        "fixed: {model: tiny-bert, dataset: demo, n_inputs: 100, steps: 2000}\n"
        "axes:\n  attack: [tag, dager]\n"
    )
    path = toy / "claims.yaml"
    path.write_text(
        "paper: A 2024\nseed: 'A 2024, \"a paper\"'\nclaims:\n  - id: one\n"
        "    table: Table 1\n    claim: something\n    experiment: exp.yaml\n    gpu: gpu.yaml\n"
    )
    (result,) = evaluate(path)
    plan = result.gpu
    assert (plan.experiment, plan.cells, plan.inputs) == ((toy / "gpu.yaml").resolve(), 2, 200)
    assert 0 < plan.gpu_s < plan.cpu_s
    dager = evaluate_gpu_cell(toy, "dager")
    assert dager.gpu_s == dager.cpu_s > 0
    text = render_results([result], lambda path: "v1", toy, "make it")
    assert "## What a GPU would add" in text
    assert "| `one` | `gpu.yaml` | 2 | 200 |" in text
    assert "on a GPU: `gpu.yaml` (the paper's size: 2 cells, 200 inputs" in text


def evaluate_gpu_cell(folder, attack: str):
    path = folder / f"gpu-{attack}.yaml"
    path.write_text(f"fixed: {{model: tiny-bert, dataset: demo, n_inputs: 10, attack: {attack}}}\n")
    return gpu_plan(path)


EXPLAINED = """\
paper: A 2024
seed: 'A 2024, "a paper"'
claims:
  - id: one
    table: Table 1
    claim: LAMP_cos recovers more than TAG.
    experiment: exp.yaml
    checks:
      - {metric: strict.rouge1, left: {cell: lamp-cos-B1}, relation: greater, right: {cell: tag-B1}}
    explanation:
      text: The sentences are short.
      see: [two, notes.md]
      checks:
        - {metric: strict.rouge1, left: {cell: tag-B2}, relation: greater, value: 10,
           right: {cell: lamp-cos-B1}}
  - id: two
    table: Table 2
    claim: something else
"""


def test_an_explanation_is_shown_with_its_checks_and_leaves_the_verdict_alone(toy):
    """A refuted claim's explanation: its checks computed from the same kept cells (and their
    cells listed), shown under the claim, the verdict still the claim's own checks'."""
    (toy / "notes.md").write_text("why\n")
    path = toy / "claims.yaml"
    path.write_text(EXPLAINED)
    one, _ = evaluate(path)
    assert one.verdict == "refuted"
    [outcome] = one.explained
    assert (outcome.left, outcome.holds) == (100.0, True)
    assert outcome.right == pytest.approx(halves_rouge1())
    assert "tag-B2" in [c.cell.name for c in one.cells]  # read only by the explanation
    assert one.see == ["two", (toy / "notes.md").resolve()]
    text = render_results([one], lambda path: "v1", toy, "make it")
    assert "Why the result differs from the paper: The sentences are short." in text
    assert "cell=tag-B2 > cell=lamp-cos-B1, by more than 10" in text
    assert "Shown in: `two`, `notes.md`." in text


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (("see: [two, notes.md]", "see: [three]"), "'three' is neither a claim of this file"),
        (("relation: greater, value: 10", "relation: times"), "explanation.checks.0"),
    ],
)
def test_a_bad_explanation_is_one_line(toy, edit, problem):
    (toy / "notes.md").write_text("why\n")
    path = toy / "claims.yaml"
    path.write_text(EXPLAINED.replace(*edit))
    with pytest.raises(GradleakError) as error:
        read_claims(path)
    message = str(error.value)
    assert "\n" not in message and "claims.yaml:" in message and problem in message


def test_sst2_cells_at_b1_show_what_the_special_tokens_add(tmp_path):
    """The special-tokens section lists each SST-2 cell at B=1 once (whatever claims read it),
    its paper-compatible scores beside the strict ones and the difference: a one-word
    sentence recovered exactly has no bigram strictly, two with [CLS] and [SEP] as words."""
    (tmp_path / "exp.yaml").write_text(
        EXPERIMENT.replace("dataset: demo", "dataset: sst2").replace("published: ", "# ")
    )
    (tmp_path / "kept").mkdir()
    for cell in expand(read_experiment(tmp_path / "exp.yaml")):
        line = sample(0, "fine", "fine")
        line["paper"] = paper_scores(["[CLS] fine [SEP]"], ["[CLS] fine [SEP]"]).to_dict()
        lines = [{"config": cell.config.identity(), "device": "cpu"}, line]
        path = tmp_path / "kept" / f"{cell.name}.json.partial.jsonl"
        path.write_text("".join(json.dumps(item) + "\n" for item in lines))
    check = "- {metric: strict.rouge1, left: {attack: tag}, relation: at_least, value: 1}"
    results = claims(tmp_path, check) + claims(tmp_path, check)
    text = render_results(results, lambda path: "v1", tmp_path, "make it")
    section = text.split("## Special tokens")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| tag-")]
    assert rows == ["| tag-B1 | `one`, `one` | 100.0 / 100.0 | 100.0 / 0.0 | +0.0 / +100.0 |"]


def test_a_learned_cells_training_curve_is_shown_under_its_table(toy):
    """A record whose inputs keep ``info.training``'s held-out losses: the curve by step, from
    its first input that has one; the other cells show none."""
    path = toy / "kept" / "tag-B1.json.partial.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    training = {"eval_every": 50, "held_out_losses": [5.25, 4.5, 4.125]}
    lines[2]["info"] = {"training": training}  # the second input (the first has no info)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    check = "- {metric: strict.rouge1, left: {attack: tag}, relation: at_least, value: 1}"
    [result] = claims(toy, check)
    curves = {c.cell.name: c.curve for c in result.cells}
    assert curves == {"tag-B1": ((50, 5.25), (100, 4.5), (150, 4.125)), "tag-B2": ()}
    text = render_results([result], lambda path: "v1", toy, "make it")
    assert "- tag-B1: 50: 5.250, 100: 4.500, 150: 4.125" in text
    assert "- tag-B2" not in text
