#include "cleave/model/model_keys.h"

#include <utility>

namespace cleave {

const std::vector<ConfigKey<ModelConfig>>& model_keys() {
  static const std::vector<ConfigKey<ModelConfig>> keys = [] {
    using M = ModelConfig;
    std::vector<ConfigKey<M>> k;
    k.push_back(choice_key("model.family", &M::family,
                           std::vector<std::pair<std::string, Family>>{{"gpt2", Family::gpt2},
                                                                       {"llama", Family::llama}}));
    k.push_back(integer_key("model.vocab_size", &M::vocab_size, 2, 1 << 24));
    k.push_back(integer_key("model.d_model", &M::d_model, 2, 1 << 16));
    k.push_back(integer_key("model.n_layers", &M::n_layers, 1, 1024));
    k.push_back(integer_key("model.n_heads", &M::n_heads, 1, 1024));
    k.push_back(integer_key("model.n_kv_heads", &M::n_kv_heads, 1, 1024));
    k.push_back(integer_key("model.ffn_hidden", &M::ffn_hidden, 1, 1 << 20));
    k.push_back(integer_key("model.max_seq_len", &M::max_seq_len, 2, 1 << 20));
    k.push_back(real_key("model.norm_eps", &M::norm_eps, 1e-12, 1.0));
    k.push_back(real_key("model.rope_theta", &M::rope_theta, 1.0, 1e9));
    k.push_back(bool_key("model.tie_embeddings", &M::tie_embeddings));
    k.push_back(real_key("model.init_std", &M::init_std, 0.0, 10.0));
    // The mixture-of-experts keys appear in a written config only for a MoE model; the router's
    // bias rate only for sigmoid_bias.
    auto moe = [](ConfigKey<M> key, bool bias_only = false) {
      key.show = [show = key.show, bias_only](const M& m) {
        const bool applies =
            m.moe_experts > 0 && (!bias_only || m.moe_router == MoeRouter::sigmoid_bias);
        return applies ? show(m) : std::string();
      };
      return key;
    };
    k.push_back(integer_key("model.moe_experts", &M::moe_experts, 0, 1 << 16));
    k.push_back(moe(integer_key("model.moe_top_k", &M::moe_top_k, 1, 1 << 16)));
    k.push_back(moe(integer_key("model.moe_shared_experts", &M::moe_shared_experts, 0, 1 << 10)));
    k.push_back(moe(integer_key("model.moe_ffn_hidden", &M::moe_ffn_hidden, 1, 1 << 20)));
    k.push_back(moe(integer_key("model.moe_every", &M::moe_every, 1, 1024)));
    k.push_back(moe(integer_key("model.moe_first_dense", &M::moe_first_dense, 0, 1024)));
    k.push_back(moe(choice_key("model.moe_router", &M::moe_router,
                               std::vector<std::pair<std::string, MoeRouter>>{
                                   {"topk_softmax", MoeRouter::topk_softmax},
                                   {"softmax_topk", MoeRouter::softmax_topk},
                                   {"sigmoid_bias", MoeRouter::sigmoid_bias}})));
    k.push_back(moe(real_key("model.moe_aux_loss_coef", &M::moe_aux_loss_coef, 0.0, 1e3)));
    k.push_back(moe(real_key("model.moe_z_loss_coef", &M::moe_z_loss_coef, 0.0, 1e3)));
    k.push_back(moe(real_key("model.moe_bias_update_rate", &M::moe_bias_update_rate, 0.0, 1.0),
                    true));
    k.push_back(moe(real_key("model.moe_capacity_factor", &M::moe_capacity_factor, 0.0, 1e3)));
    return k;
  }();
  return keys;
}

void resolve_model_config(ModelConfig& m, const std::set<std::string>& given,
                          const std::string& origin) {
  auto fail = [&](const std::string& msg) { throw Error(origin + ": " + msg); };
  if (!given.count("model.n_kv_heads")) m.n_kv_heads = m.n_heads;
  if (!given.count("model.tie_embeddings")) m.tie_embeddings = m.family == Family::gpt2;
  if (!given.count("model.ffn_hidden"))  // Llama's 2/3 * 4d, rounded up to a multiple of 32
    m.ffn_hidden = m.family == Family::gpt2 ? 4 * m.d_model : (8 * m.d_model / 3 + 31) / 32 * 32;
  if (!given.count("model.moe_ffn_hidden")) m.moe_ffn_hidden = m.ffn_hidden;
  for (const std::string& key : given)
    if (key.rfind("model.moe_", 0) == 0 && key != "model.moe_experts" && m.moe_experts == 0)
      fail(key + " is set but model.moe_experts = 0: the model has no mixture-of-experts layer");
  if (m.moe_experts > 0) {
    if (m.moe_top_k > m.moe_experts)
      fail("model.moe_top_k = " + std::to_string(m.moe_top_k) + " exceeds model.moe_experts = " +
           std::to_string(m.moe_experts));
    if (m.moe_layers() == 0)
      fail("model.moe_first_dense = " + std::to_string(m.moe_first_dense) +
           " and model.moe_every = " + std::to_string(m.moe_every) + " leave none of the " +
           std::to_string(m.n_layers) + " layers a mixture of experts");
    if (given.count("model.moe_bias_update_rate") && m.moe_router != MoeRouter::sigmoid_bias)
      fail("model.moe_bias_update_rate is set but model.moe_router = \"" +
           std::string(moe_router_name(m.moe_router)) + "\": only sigmoid_bias has a bias");
  }
  if (m.d_model % m.n_heads != 0)
    fail("model.d_model = " + std::to_string(m.d_model) + " is not divisible by model.n_heads = " +
         std::to_string(m.n_heads));
  if (m.n_heads % m.n_kv_heads != 0)
    fail("model.n_heads = " + std::to_string(m.n_heads) +
         " is not divisible by model.n_kv_heads = " + std::to_string(m.n_kv_heads));
  if (m.family == Family::gpt2 && m.n_kv_heads != m.n_heads)
    fail("model.n_kv_heads = " + std::to_string(m.n_kv_heads) +
         ": the gpt2 family has no grouped-query attention; it must equal model.n_heads = " +
         std::to_string(m.n_heads) + " (use family = \"llama\")");
  if (m.family == Family::llama && m.head_dim() % 2 != 0)
    fail("head dimension model.d_model / model.n_heads = " + std::to_string(m.head_dim()) +
         " must be even for rotary embeddings");
}

ModelConfig read_model_config(const toml::table& root, const std::string& origin) {
  ModelConfig m;
  std::set<std::string> given;
  if (const toml::table* table = root["model"].as_table())
    read_table(*table, "model", model_keys(), m, origin, given);
  resolve_model_config(m, given, origin);
  return m;
}

}  // namespace cleave
