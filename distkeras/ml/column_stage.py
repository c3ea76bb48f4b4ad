"""`ColumnTransformer`, the base of the DataFrame transformers: one input column in, one
output column added (never over another column without a word)."""

from pyspark.ml import Transformer
from pyspark.ml.param.shared import HasInputCol, HasOutputCol
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable

from distkeras.data.frame_columns import check_output_column_free, same_column
from distkeras.ml.params import require, set_params, setter


class ColumnTransformer(Transformer, HasInputCol, HasOutputCol, DefaultParamsReadable,
                         DefaultParamsWritable):
    """Base of the transformers here: one input column in, one output column added."""

    setParams = set_params
    setInputCol = setter("inputCol")
    setOutputCol = setter("outputCol")

    def _columns(self):
        return require(self, self.inputCol), require(self, self.outputCol)

    def _transform(self, dataset):
        input_col, output_col = self._columns()
        if not same_column(dataset, output_col, input_col):
            # withColumn would replace it without a word: LabelIndexTransformer(...,
            # output_col="label") wrote the predictions over the labels, which then scored
            # an accuracy of 1.0. Replacing the input column itself stays as asked.
            check_output_column_free(dataset, output_col, f"{type(self).__name__}: column")
        return dataset.withColumn(output_col, self._expression(dataset, input_col))

    def _expression(self, dataset, input_col):
        raise NotImplementedError
