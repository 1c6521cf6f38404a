#include "daemon/auth/peer_tls.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/auth/dns_name.h"

namespace railyard::auth {
namespace {

struct Free {
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509_STORE* p) const { X509_STORE_free(p); }
  void operator()(X509_STORE_CTX* p) const { X509_STORE_CTX_free(p); }
  void operator()(GENERAL_NAMES* p) const { GENERAL_NAMES_free(p); }
  void operator()(STACK_OF(X509) * p) const { sk_X509_pop_free(p, X509_free); }
};
template <typename T>
using Ptr = std::unique_ptr<T, Free>;

Ptr<BIO> MemBio(absl::string_view text) {
  return Ptr<BIO>(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

// The first certificate in pem, or null.
Ptr<X509> FirstCert(absl::string_view pem) {
  Ptr<BIO> bio = MemBio(pem);
  if (bio == nullptr) return nullptr;
  return Ptr<X509>(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

// Every certificate in pem (empty when none parses).
std::vector<Ptr<X509>> AllCerts(absl::string_view pem) {
  std::vector<Ptr<X509>> certs;
  Ptr<BIO> bio = MemBio(pem);
  if (bio == nullptr) return certs;
  while (X509* c = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) certs.emplace_back(c);
  ERR_clear_error();  // the read that ended the loop
  return certs;
}

CertNames NamesOf(X509* cert) {
  CertNames names;
  Ptr<GENERAL_NAMES> sans(
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr)));
  if (sans == nullptr) return names;
  for (int i = 0; i < sk_GENERAL_NAME_num(sans.get()); ++i) {
    const GENERAL_NAME* gn = sk_GENERAL_NAME_value(sans.get(), i);
    if (gn->type == GEN_DNS) {
      const ASN1_IA5STRING* s = gn->d.dNSName;
      names.dns.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                             static_cast<size_t>(ASN1_STRING_length(s)));
    } else if (gn->type == GEN_IPADD) {
      const ASN1_OCTET_STRING* s = gn->d.iPAddress;
      const int len = ASN1_STRING_length(s);
      char text[INET6_ADDRSTRLEN] = {};
      const int family = len == 4 ? AF_INET : len == 16 ? AF_INET6 : -1;
      if (family != -1 && inet_ntop(family, ASN1_STRING_get0_data(s), text, sizeof text)) {
        names.ips.emplace_back(text);
      }
    }
  }
  return names;
}

absl::StatusOr<std::string> ReadFile(absl::string_view flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", path, ": cannot read the file"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", path, ": the file is empty"));
  }
  return ss.str();
}

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();  // NOLINT(runtime/int): OpenSSL's type
  ERR_clear_error();
  if (e == 0) return "no PEM block of that kind";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

}  // namespace

std::string CertNames::ToString() const {
  std::vector<std::string> all;
  for (const auto& d : dns) all.push_back("DNS:" + d);
  for (const auto& i : ips) all.push_back("IP:" + i);
  return all.empty() ? "none" : absl::StrJoin(all, ", ");
}

bool CertNamesHost(const CertNames& names, absl::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string h(host);
  unsigned char addr[16];
  for (const int family : {AF_INET, AF_INET6}) {
    if (inet_pton(family, h.c_str(), addr) != 1) continue;
    char text[INET6_ADDRSTRLEN] = {};
    inet_ntop(family, addr, text, sizeof text);  // the form NamesOf writes
    return std::find(names.ips.begin(), names.ips.end(), text) != names.ips.end();
  }
  for (const auto& dns : names.dns) {
    if (DnsNameMatches(dns, host)) return true;
  }
  return false;
}

absl::StatusOr<CertNames> SubjectAltNames(absl::string_view pem) {
  Ptr<X509> cert = FirstCert(pem);
  if (cert == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError("not a PEM certificate");
  }
  return NamesOf(cert.get());
}

absl::StatusOr<PeerTlsPem> LoadPeerTls(const std::string& cert_file, const std::string& key_file,
                                       const std::string& ca_file, absl::string_view node_name,
                                       absl::Time now) {
  PeerTlsPem pem;
  absl::StatusOr<std::string> text = ReadFile("peer_tls_cert", cert_file);
  if (!text.ok()) return text.status();
  pem.cert_chain = *std::move(text);
  text = ReadFile("peer_tls_key", key_file);
  if (!text.ok()) return text.status();
  pem.private_key = *std::move(text);
  text = ReadFile("peer_tls_ca", ca_file);
  if (!text.ok()) return text.status();
  pem.ca = *std::move(text);

  std::vector<Ptr<X509>> chain = AllCerts(pem.cert_chain);
  if (chain.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--peer_tls_cert ", cert_file, ": not a PEM certificate (", OpenSslError(), ")"));
  }
  X509* cert = chain.front().get();
  Ptr<EVP_PKEY> key;
  if (Ptr<BIO> bio = MemBio(pem.private_key); bio != nullptr) {
    key.reset(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  }
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--peer_tls_key ", key_file,
                                                   ": not an unencrypted PEM private key (",
                                                   OpenSslError(), ")"));
  }
  std::vector<Ptr<X509>> cas = AllCerts(pem.ca);
  if (cas.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--peer_tls_ca ", ca_file, ": not a PEM certificate (", OpenSslError(), ")"));
  }
  const CertNames names = NamesOf(cert);
  const std::string what = absl::StrCat("certificate ", cert_file, " (SANs: ", names.ToString(),
                                        ") for node '", node_name, "'");
  if (X509_check_private_key(cert, key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("--peer_tls_key ", key_file, " is not the key of ", what));
  }

  Ptr<X509_STORE> store(X509_STORE_new());
  for (const auto& ca : cas) X509_STORE_add_cert(store.get(), ca.get());
  Ptr<STACK_OF(X509)> untrusted(sk_X509_new_null());
  for (size_t i = 1; i < chain.size(); ++i) {
    X509_up_ref(chain[i].get());
    sk_X509_push(untrusted.get(), chain[i].get());
  }
  Ptr<X509_STORE_CTX> ctx(X509_STORE_CTX_new());
  if (store == nullptr || untrusted == nullptr || ctx == nullptr ||
      X509_STORE_CTX_init(ctx.get(), store.get(), cert, untrusted.get()) != 1) {
    return absl::InternalError("OpenSSL could not set up certificate verification");
  }
  X509_VERIFY_PARAM_set_time(X509_STORE_CTX_get0_param(ctx.get()), absl::ToTimeT(now));
  if (X509_verify_cert(ctx.get()) != 1) {
    const int err = X509_STORE_CTX_get_error(ctx.get());
    ERR_clear_error();
    return absl::FailedPreconditionError(
        absl::StrCat(what, " does not verify against the CA --peer_tls_ca ", ca_file, ": ",
                     X509_verify_cert_error_string(err)));
  }
  for (const auto& dns : names.dns) {
    if (CertNamesNode(dns, node_name)) return pem;
  }
  return absl::FailedPreconditionError(
      absl::StrCat(what,
                   " does not name the node in a DNS subjectAltName: other daemons would refuse it "
                   "(make one with DNS:",
                   node_name, ", or set --node_name to a name it has)"));
}

}  // namespace railyard::auth
