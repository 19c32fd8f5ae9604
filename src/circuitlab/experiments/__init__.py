"""Ready-made experiments: pipelines that train or load models, run analyses and return results that
report/ renders. They sit above the library (model, data, training, analysis, viz, report) and below
the commands; nothing in the library imports them.

demo               `circuitlab demo`: a 2-layer and a 1-layer attention-only model, their induction heads
interpret          `circuitlab interpret`: named experiments on a checkpoint (the methods of circuitlab/methods/)
forge_compare      `circuitlab forge compare`: an adder trained on the addition task against the hand-built one
circuit            `circuitlab circuit`: edge scores, a pruned circuit and its faithfulness on a checkpoint
features_demo      `circuitlab sae demo`: a 1-layer MLP model, a dictionary on its MLP, its readable features
dashboards         `circuitlab sae dashboards`: a dictionary's feature dashboards on held-out text, saved and drawn
sae_train          `circuitlab sae train`: dictionaries (SAEs, transcoders, CLTs) from a YAML config, spliced in
sae_eval           `circuitlab sae eval`: a dictionary or CLT on held-out text: L0, explained variance, CE recovered
lens_train         `circuitlab lens train`: a tuned lens for a checkpoint, against the logit lens on held-out text
lens_show          `circuitlab lens show`: a prompt through the logit lens and a saved tuned lens, side by side
graphs_demo        `circuitlab graph demo`: a trained model's graphs, each story tested; it makes the prompts and runs
                   the graph method on each (circuitlab/methods/graph.py's explain: the graph `circuitlab graph`
                   makes, its numbers and the intervention of graphs/verify.py) as a notebook would

Import from the submodules (they pull in the trainer and matplotlib).
"""
