"""Test accuracy of a few zoo runs side by side, without touching docs/ (a quick A/B).

    python benchmarks/zoo_compare.py --models cnn vit --runs fit aeasgd eamsgd adag/4 \
        "diloco:outer_learning_rate=0.5,outer_momentum=0.3" --seeds 1 2 3

Same data, models and settings as `zoo.py` (the first 6,000 Fashion-MNIST rows by
default, 3 epochs, batch 32, Adam, 2 workers); prints one line per run and seed: model,
run, seed, test accuracy, wall seconds, validation accuracy after each epoch; then, with
several seeds, one line per run: the mean test accuracy, its spread (max - min) and its
points against `fit`'s mean where `fit` ran.

A run is a `zoo.py` run name, optionally ``/W`` (communication_window=W) and
``:key=value,...`` (more constructor arguments, numbers or None/True/False;
``worker_rate=R``: the workers' Adam at rate R, for trainers whose ``learning_rate`` is
another rate).
A seed sets the initial weights, the shuffling and the dropout masks (`zoo.py` alone
always uses seed 1).
"""

import argparse
import ast
import statistics

import zoo


def run_spec(text):
    """Checks a run (``name[/W][:key=value,...]``); returns it unchanged."""
    name, _, settings = text.partition(":")
    zoo.run_name(name)
    for item in filter(None, settings.split(",")):
        key, equals, value = item.partition("=")
        if not equals or not key.isidentifier():
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected key=value after ':' (fedadam:epsilon=0.01)")
        try:
            ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise argparse.ArgumentTypeError(
                f"{text!r}: {value!r} is not a number, None, True or False") from None
    return text


def register(spec):
    """Makes ``spec`` a name `zoo.run` knows: its run's trainer with the extra arguments."""
    name, _, settings = spec.partition(":")
    if not settings:
        return spec
    base, _, window = name.partition("/")
    trainer, extra = zoo.RUNS[base]
    extra = dict(extra, **{key: ast.literal_eval(value) for key, value in
                           (item.split("=", 1) for item in settings.split(",") if item)})
    if "worker_rate" in extra:  # the workers' Adam at this rate
        extra["worker_optimizer"] = {"class_name": "Adam", "config": {
            "learning_rate": extra.pop("worker_rate")}}
    key = spec.replace("/", "_w")  # zoo.run reads "/W" as the window: keep it last
    zoo.RUNS[key] = (trainer, extra)
    return f"{key}/{window}" if window else key


BUILD_MODEL = zoo.build_model


def seeded(seed):
    """`zoo.build_model`, re-seeded: zoo.run seeds 1 just before it builds the model."""
    import keras

    def build_model(kind):
        keras.utils.set_random_seed(seed)
        return BUILD_MODEL(kind)

    return build_model


def summary(kind, spec, accuracies, fit):
    mean = statistics.fmean(accuracies)
    versus = "" if fit is None else f"  {(mean - fit) * 100:+.2f} points vs fit"
    return (f"{kind:10s} {spec:40s} mean {mean:.4f} spread {max(accuracies) - min(accuracies):.4f}"
            f" ({' '.join(f'{a:.4f}' for a in accuracies)}){versus}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(zoo.MODELS), choices=zoo.MODELS)
    parser.add_argument("--runs", nargs="+", required=True, type=run_spec,
                        help=f"Of {', '.join(zoo.RUNS)}; NAME/W sets communication_window=W;"
                        " NAME:key=value,... sets more arguments.")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1],
                        help="one run per seed (default: 1, as zoo.py)")
    parser.add_argument("--limit", type=int, default=6000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--validation", type=int, default=2000)
    args = parser.parse_args()
    from distkeras.session import local_spark_session, warm_up_executors

    spark = local_spark_session("local[2]")
    warm_up_executors(spark, 2)
    summaries = []
    for kind in args.models:
        frame, data = zoo.load(spark, kind, args.limit, args.validation)
        accuracies = {spec: [] for spec in args.runs}
        for seed in args.seeds:
            zoo.build_model = seeded(seed)
            for spec in args.runs:
                result = zoo.run(register(spec), kind, frame, data, args.epochs, 32)
                accuracies[spec].append(result["accuracy"])
                points = " ".join(f"{accuracy:.3f}" for _, accuracy in result["points"]
                                  if accuracy is not None)
                print(f"{kind:10s} {spec:40s} seed {seed} {result['accuracy']:.4f} "
                      f"{result['seconds']:6.1f} s  {points}", flush=True)
        zoo.build_model = BUILD_MODEL
        frame.unpersist()
        if len(args.seeds) > 1:
            fit = statistics.fmean(accuracies["fit"]) if "fit" in accuracies else None
            summaries += [summary(kind, spec, values, fit)
                          for spec, values in accuracies.items()]
    for line in summaries:
        print(line, flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
