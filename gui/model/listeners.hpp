#pragma once

// Who follows a model: views subscribe and are called after each change, so no one has to tell
// each view by hand. A subscription ends when its handle goes; a handle that outlives its model
// is harmless (a window destroys its models before its child widgets). A copy of a model starts
// with no listeners of its own.

#include <algorithm>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace pipetune::gui {

class Listeners {
  using List = std::vector<std::pair<int, std::function<void()>>>;

 public:
  class Subscription {
   public:
    Subscription() = default;
    Subscription(std::weak_ptr<List> list, int id) : list_(std::move(list)), id_(id) {}
    Subscription(Subscription&& other) noexcept = default;
    Subscription& operator=(Subscription&& other) noexcept {
      if (this != &other) {
        reset();
        list_ = std::move(other.list_);
        id_ = other.id_;
      }
      return *this;
    }
    Subscription(const Subscription&) = delete;
    Subscription& operator=(const Subscription&) = delete;
    ~Subscription() { reset(); }

    void reset() {
      if (auto list = list_.lock())
        std::erase_if(*list, [this](const auto& entry) { return entry.first == id_; });
      list_.reset();
    }

   private:
    std::weak_ptr<List> list_;
    int id_ = -1;
  };

  Listeners() = default;
  Listeners(const Listeners&) : Listeners() {}
  Listeners& operator=(const Listeners&) { return *this; }

  /// Const: following a model changes none of its data, and views hold models read-only.
  [[nodiscard]] Subscription add(std::function<void()> listener) const {
    list_->emplace_back(next_id_, std::move(listener));
    return {list_, next_id_++};
  }

  /// Calls every listener; one may unsubscribe itself (or another) while this runs.
  void notify() const {
    const List now = *list_;
    for (const auto& [id, listener] : now) listener();
  }

 private:
  std::shared_ptr<List> list_ = std::make_shared<List>();
  mutable int next_id_ = 0;
};

}  // namespace pipetune::gui
