#include "server/step_metrics.h"

#include "fedlearn/v1/coordinator.pb.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

v1::UpdateHeader Header(int64_t examples, double loss, double accuracy,
                        int64_t validation_examples = 0,
                        double validation_loss = 0,
                        double validation_accuracy = 0) {
  v1::UpdateHeader h;
  h.set_num_examples(examples);
  h.set_train_loss(loss);
  h.set_train_accuracy(accuracy);
  h.set_num_validation_examples(validation_examples);
  h.set_validation_loss(validation_loss);
  h.set_validation_accuracy(validation_accuracy);
  return h;
}

TEST(StepMetricsTest, AnEmptyStepReportsZerosAndNoValidation) {
  v1::RoundRecord record;
  StepMetrics().Fill(&record);
  EXPECT_EQ(record.bytes_received(), 0);
  EXPECT_EQ(record.metrics().num_examples(), 0);
  EXPECT_EQ(record.metrics().train_loss(), 0);
  EXPECT_FALSE(record.metrics().has_validation());
}

TEST(StepMetricsTest, TrainingIsWeightedByExamplesValidationByItsOwnCounts) {
  StepMetrics metrics;
  // Two clients validated (20 and 60 examples), one did not: its validation
  // fields are ignored, not averaged in as zeros.
  metrics.Add(AnswerMetrics::FromHeader(Header(100, 0.4, 0.9, 20, 0.5, 0.8),
                                        /*bytes=*/1000));
  metrics.Add(AnswerMetrics::FromHeader(Header(300, 0.8, 0.5, 60, 0.9, 0.4),
                                        /*bytes=*/3000));
  metrics.Add(AnswerMetrics::FromHeader(Header(100, 1.0, 0.2, 0, 7.0, 7.0),
                                        /*bytes=*/500));
  v1::RoundRecord record;
  metrics.Fill(&record);
  EXPECT_EQ(record.bytes_received(), 4500);
  const v1::RoundMetrics& m = record.metrics();
  EXPECT_EQ(m.num_examples(), 500);
  // By hand: (100 * 0.4 + 300 * 0.8 + 100 * 1.0) / 500 = 380 / 500.
  EXPECT_DOUBLE_EQ(m.train_loss(), 0.76);
  // (100 * 0.9 + 300 * 0.5 + 100 * 0.2) / 500 = 260 / 500.
  EXPECT_DOUBLE_EQ(m.train_accuracy(), 0.52);
  ASSERT_TRUE(m.has_validation());
  // (20 * 0.5 + 60 * 0.9) / 80 = 64 / 80, and (20 * 0.8 + 60 * 0.4) / 80.
  EXPECT_DOUBLE_EQ(m.validation_loss(), 0.8);
  EXPECT_DOUBLE_EQ(m.validation_accuracy(), 0.5);
  EXPECT_EQ(metrics.num_examples(), 500);
}

}  // namespace
}  // namespace fedlearn
