"""One prompt's graph in words (methods/graph.py's GraphFinding, what explain() returns and the graphs demo
reports): each sentence from made-up numbers, and every verdict against the numbers that would make it false.

(Moved from tests/experiments/test_graphs_demo.py with the module it tests, issue 38; assertions unchanged.)"""
from circuitlab.graphs.verify import Ablation
from circuitlab.methods.graph import GraphFinding


def _finding(**change) -> GraphFinding:
    values = dict(slug="name", mechanism="name", prompt="... One day, Kilo", target="mo", p_target=0.8, rank=1,
                  top_prediction="mo", scores={"replacement": 0.7, "completeness": 0.9}, n_active_features=400,
                  pruned={"nodes": 60, "features": 30, "edges": 200}, focus="the earlier mentions of 'Kilomo'",
                  focus_positions=[8, 9, 11, 12], token_share={"focus": 0.6, "last": 0.3, "other": 0.1},
                  logit_inputs={"feature": 0.3, "error": 0.2, "token": 0.5}, top_features=[],
                  top_path="token 'mo' @9 -> logit 'mo'",
                  ablation=Ablation(["L1 F3 @20"], 0.8, 0.1, 0.2, 0.75, ["L1 F9 @20"], " the"),
                  p_without_context=0.05)
    values.update(change)
    return GraphFinding(**values)


def test_sentences_follow_the_numbers():
    text = " ".join(_finding().sentences())
    assert "gives 'mo' probability 0.80 (its top prediction)" in text
    assert "it gives 0.05: the context raises p('mo') from 0.05 to 0.80, so the prediction comes from the context" \
        in text
    assert "Replacement score 0.70, completeness 0.90: the transcoders' features explain most" in text
    assert "(positions 8, 9, 11, 12) hold 60% of the token nodes' influence on 'mo', the last token 30%: the graph " \
           "traces more of the prediction to the earlier mention than to the last token." in text
    assert "30% from features, 20% from error nodes, 50% straight from token embeddings" in text
    assert "to -1x their activation moves p('mo') from 0.80 to 0.10 in the replacement model and to 0.20 in the " \
           "real model" in text
    assert "zeroing them instead" not in text
    assert "gives 0.75. This confirms that these features carry the prediction: they remove 75% of p('mo'), the " \
           "control removes 6%." in text
    # flip each number: the sentence turns
    flipped = " ".join(_finding(p_without_context=0.9, rank=3, top_prediction="the", scores={
        "replacement": 0.3, "completeness": 0.5}, token_share={"focus": 0.2, "last": 0.7, "other": 0.1}).sentences())
    assert "(rank 3; its top prediction is 'the')" in flipped
    assert "predicts it at least as well alone, so this prompt does not test copying from earlier" in flipped
    assert "the error nodes (what the transcoders miss) carry most of the influence" in flipped
    assert "traces more of the prediction to the last token than to the earlier mention." in flipped
    survives = " ".join(_finding(ablation=Ablation(["L1 F3 @20"], 0.8, 0.7, 0.7, 0.8, ["x"], "mo",
                                                   p_zeroed=0.75)).sentences())
    assert "does not confirm the story: the intervention removes only 13% of p('mo') (confirming takes 50%); 50% " \
           "of the logit's direct input comes straight from the token embeddings through attention" in survives
    errors = _finding(logit_inputs={"feature": 0.3, "error": 0.6, "token": 0.1},
                      ablation=Ablation(["L1 F3 @20"], 0.8, 0.7, 0.7, 0.8, ["x"], "mo"))
    assert "(confirming takes 50%); 60% of the logit's direct input comes from the error nodes" in \
        " ".join(errors.sentences())
    assert "; zeroing them instead gives 0.75;" in survives
    assert "(attention free; still predicting 'mo')" in survives and "now predicting ' the'" in text
    control = " ".join(_finding(ablation=Ablation(["L1 F3 @20"], 0.8, 0.1, 0.2, 0.3, ["x"], "the")).sentences())
    assert "other active features at the same places removes 62% of p('mo'), more than half of the 75% these " \
           "remove, so the graph did not single these out" in control
    phrase = _finding(mechanism="phrase", p_without_context=None, focus="the phrase's earlier words 'Once upon'",
                      token_share={"focus": 0.3, "last": 0.1, "other": 0.6})
    assert "most of the influence comes from outside the phrase" in " ".join(phrase.sentences())
    assert "Without the earlier" not in " ".join(phrase.sentences())
    phrase.token_share = {"focus": 0.3, "last": 0.3, "other": 0.4}
    assert "traces the prediction to the phrase itself" in " ".join(phrase.sentences())


def _verdicts(finding) -> str:
    return " ".join(finding.sentences())


def test_no_verdict_stands_on_numbers_that_contradict_it():
    """Every verdict sentence against the numbers that would make it false (the short run's cases from issue 40
    among them): the verdict turns, or says that nothing can be concluded."""
    # the target not predicted (p 0.00, rank 41): no story about copying, tracing or the intervention stands
    unpredicted = _finding(p_target=0.001, rank=41, top_prediction=" the", p_without_context=0.0,
                           ablation=Ablation(["L1 F3 @20"], 0.001, 0.0, 0.0, 0.001, ["x"], " the"))
    text = _verdicts(unpredicted)
    assert "it gives 0.00: nothing can be concluded about copying: the model gives 'mo' only 0.00" in text
    assert "comes from the context" not in text and "traces" not in text and "This confirms" not in text
    assert "nothing can be concluded about the prediction" in text and "Nothing can be concluded from it" in text
    assert unpredicted.confirmed is None and unpredicted.to_dict()["ablation"]["confirms"] is None
    for p in (0.049, 0.05):   # the floor: below it untested, at it tested
        assert ("Nothing can be concluded" in _verdicts(_finding(p_target=p))) == (p < 0.05)
    # context: raised less than twofold is not "from the context"; at least as well alone is not "raised"
    assert "the context raises it less than twofold, so this prompt does not clearly test copying" in \
        _verdicts(_finding(p_without_context=0.5))
    assert "comes from the context" not in _verdicts(_finding(p_without_context=0.4))   # exactly half: not twofold
    assert "at least as well alone" in _verdicts(_finding(p_without_context=0.8))
    # replacement: equal shares are neither's "most"
    assert "the features and the error nodes carry equal shares" in _verdicts(_finding(scores={"replacement": 0.5,
                                                                                              "completeness": 0.9}))
    # tracing (name): ties and a larger rest are said
    assert "the earlier mention and the last token hold equal shares." in \
        _verdicts(_finding(token_share={"focus": 0.4, "last": 0.4, "other": 0.2}))
    assert "traces more of the prediction to the earlier mention than to the last token, though other positions " \
           "hold more (70%)." in _verdicts(_finding(token_share={"focus": 0.2, "last": 0.1, "other": 0.7}))
    # tracing (phrase): exactly half
    half = _finding(mechanism="phrase", p_without_context=None, token_share={"focus": 0.25, "last": 0.25, "other": 0.5})
    assert "half of the influence comes from the phrase, half from outside it" in _verdicts(half)
    # intervention: p raised is not "removes"; a control that raises p is said as such; 'still' needs the same top
    up = _verdicts(_finding(ablation=Ablation(["a"], 0.6, 0.7, 0.86, 0.4, ["b"], "mo")))
    assert "the intervention does not lower p('mo')" in up and "removes only" not in up
    assert "the control raises it." in _verdicts(_finding(ablation=Ablation(["a"], 0.8, 0.1, 0.1, 0.9, ["b"], "x")))
    assert "now predicting 'mo'" in _verdicts(_finding(rank=2, top_prediction=" the",
                                                      ablation=Ablation(["a"], 0.4, 0.3, 0.3, 0.4, ["b"], "mo")))
    assert "largest share of the logit's direct input, 70%, comes from features." in _verdicts(_finding(
        logit_inputs={"feature": 0.7, "error": 0.1, "token": 0.2},
        ablation=Ablation(["a"], 0.8, 0.7, 0.7, 0.8, ["b"], "mo")))
