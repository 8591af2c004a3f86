// The model zoo: specs, layer counts, bad specs.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "executor/models/model.hpp"
#include "sim/error.hpp"

namespace pipetune {
namespace {

TEST(Models, ZooBuildsEachFamilyWithItsLayers) {
  auto mlp = models::build_model("mlp:layers=3,width=8,classes=4");
  EXPECT_EQ(mlp.layer_names, (std::vector<std::string>{"block0", "block1", "block2", "head"}));
  EXPECT_EQ(mlp.spec, "mlp:layers=3,width=8,input=8,classes=4,dropout=0");
  auto [x, y] = mlp.make_batch(5, 1, 0);
  EXPECT_EQ(mlp.layers->forward(x).sizes(), (std::vector<std::int64_t>{5, 4}));

  auto gpt = models::build_model("gpt:layers=2,width=16,heads=4,seq=6,vocab=20");
  EXPECT_EQ(gpt.layer_names.size(), 4u);
  auto [tokens, next] = gpt.make_batch(3, 1, 0);
  EXPECT_EQ(gpt.layers->forward(tokens).sizes(), (std::vector<std::int64_t>{3, 6, 20}));
  EXPECT_TRUE(std::isfinite(gpt.loss(gpt.layers->forward(tokens), next).item<double>()));

  auto resnet = models::build_model("resnet:blocks=2,channels=4,image=8,classes=3");
  EXPECT_EQ(resnet.layer_names, (std::vector<std::string>{"stem", "block0", "block1", "head"}));
  auto [images, labels] = resnet.make_batch(2, 1, 0);
  EXPECT_EQ(resnet.layers->forward(images).sizes(), (std::vector<std::int64_t>{2, 3}));
}

TEST(Models, SameSeedSameParameters) {
  auto a = models::build_model("mlp:layers=2,width=8"),
       b = models::build_model("mlp:layers=2,width=8");
  auto pa = a.layers->parameters(), pb = b.layers->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (std::size_t k = 0; k < pa.size(); ++k) EXPECT_TRUE(at::equal(pa[k], pb[k]));
}

TEST(Models, BadSpecsSayWhatIsWrong) {
  // In the library's words, with the model named as the input at fault; no front end's flag.
  auto error = [](const std::string& spec) -> std::string {
    try {
      models::build_model(spec);
    } catch (const InputError& e) {
      EXPECT_EQ(e.input(), Input::Model) << e.what();
      EXPECT_EQ(std::string(e.what()).find("--"), std::string::npos) << e.what();
      // A front end names the input its own way and keeps the rest word for word.
      EXPECT_EQ("--model" + std::string(e.what()).substr(5), e.naming_input_as("--model"));
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error("mlp:layers=0"), "model: mlp: layers: expected a positive integer, got \"0\"");
  EXPECT_EQ(error("mlp:depth=3"),
            "model: mlp: unknown key \"depth\" (expected one of: classes, dropout, input, layers, "
            "width)");
  EXPECT_EQ(error("gpt:width=10,heads=3"),
            "model: gpt: heads: expected a divisor of width 10, got 3");
  EXPECT_EQ(error("mlp:dropout=1.5"),
            "model: mlp: dropout: expected a number in [0, 1), got \"1.5\"");
  EXPECT_EQ(error("transformer"),
            "model: unknown model \"transformer\" (expected " + models::model_catalogue() + ")");
  EXPECT_EQ(error("/nowhere/model.pt"), "model: /nowhere/model.pt: no such file");
}

TEST(Models, DeferredBatchNormWhereThereIsNoneToDeferIsRefused) {
  // Silently ignored before: a TorchScript model's running statistics moved per micro-batch.
  models::ModelOptions deferred;
  deferred.deferred_batch_norm = true;
  auto error = [&](const std::string& spec) -> std::string {
    try {
      models::build_model(spec, deferred);
    } catch (const InputError& e) {
      EXPECT_EQ(e.input(), Input::Model);
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error("torchscript:path=/nowhere/model.pt,input=8"),
            "model: torchscript: deferred batch norm is only the zoo's resnet's: a TorchScript "
            "model's batch norms update their running statistics per micro-batch, as in torch");
  EXPECT_EQ(error("mlp:layers=2,width=8"),
            "model: mlp: deferred batch norm: it has no batch norm (only the zoo's resnet has)");
  EXPECT_EQ(error("resnet:blocks=1,channels=4,image=8,classes=3"), "");
}

}  // namespace
}  // namespace pipetune
