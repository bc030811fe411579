#ifndef FEDLEARN_SERVER_WEIGHTED_MEAN_H_
#define FEDLEARN_SERVER_WEIGHTED_MEAN_H_

namespace fedlearn {

// A weighted mean of scalars (loss, accuracy), folded one value at a time.
class WeightedMean {
 public:
  void Add(double value, double weight) {
    sum_ += value * weight;
    weight_ += weight;
  }
  double weight() const { return weight_; }
  // 0 when nothing was added.
  double value() const { return weight_ > 0 ? sum_ / weight_ : 0.0; }

 private:
  double sum_ = 0;
  double weight_ = 0;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_WEIGHTED_MEAN_H_
