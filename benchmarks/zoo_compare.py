"""Test accuracy of a few zoo runs side by side, without touching docs/ (a quick A/B).

    python benchmarks/zoo_compare.py --models cnn vit --runs fit aeasgd eamsgd adag/4

Same data, models and settings as `zoo.py` (the first 6,000 Fashion-MNIST rows by
default, 3 epochs, batch 32, Adam, 2 workers); prints one line per run: model, run, test
accuracy, wall seconds, validation accuracy after each epoch.
"""

import argparse

import zoo


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(zoo.MODELS), choices=zoo.MODELS)
    parser.add_argument("--runs", nargs="+", required=True, type=zoo.run_name,
                        help=f"Of {', '.join(zoo.RUNS)}; NAME/W sets communication_window=W.")
    parser.add_argument("--limit", type=int, default=6000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--validation", type=int, default=2000)
    args = parser.parse_args()
    from distkeras.session import local_spark_session, warm_up_executors

    spark = local_spark_session("local[2]")
    warm_up_executors(spark, 2)
    for kind in args.models:
        frame, data = zoo.load(spark, kind, args.limit, args.validation)
        for name in args.runs:
            result = zoo.run(name, kind, frame, data, args.epochs, 32)
            points = " ".join(f"{accuracy:.3f}" for _, accuracy in result["points"]
                              if accuracy is not None)
            print(f"{kind:10s} {name:16s} {result['accuracy']:.4f} {result['seconds']:6.1f} s"
                  f"  {points}", flush=True)
        frame.unpersist()
    spark.stop()


if __name__ == "__main__":
    main()
